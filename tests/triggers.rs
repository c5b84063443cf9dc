//! Trigger sources as components: the registry (built-ins, plugins, broken
//! plugins), `schedule@1` and `manual@1` semantics, property tests of the
//! fixed grid, coalescing, `count`, `until` and `rearm`, and `cron@1` across
//! daylight-saving transitions.

use chrono::{DateTime, Duration, TimeZone, Timelike, Utc};
use proptest::prelude::*;
use serde_json::{json, Value};
use stepwell::triggers::{Origin, TriggerError, TriggerRegistry};
use stepwell_tests::{engine, trigger_component, trigger_registry};

fn registry() -> TriggerRegistry {
    TriggerRegistry::load(&engine(), None).expect("built-ins load")
}

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn fmt(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[test]
fn the_built_in_sources_are_listed_and_available() {
    let r = registry();
    let names: Vec<_> = r
        .entries()
        .iter()
        .map(|e| (e.name.as_str(), e.available))
        .collect();
    assert_eq!(
        names,
        [
            ("schedule@1", true),
            ("manual@1", true),
            ("webhook.received@1", true),
            ("feed.item@1", true)
        ]
    );
    for e in r.entries() {
        assert_eq!(e.origin, Origin::Builtin);
        let d = e.descriptor.as_ref().unwrap();
        assert!(d.config_schema.is_object() && d.event_schema.is_object());
    }
    let kinds: Vec<_> = r
        .entries()
        .iter()
        .map(|e| json!(e.descriptor.as_ref().unwrap().kind))
        .collect();
    assert_eq!(
        kinds,
        [
            json!("time"),
            json!("manual"),
            json!("event"),
            json!("event")
        ]
    );
}

#[test]
fn a_broken_plugin_folder_leaves_every_other_source_working() {
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"not a component").unwrap();
    let node = stepwell_tests::component("hello/greet.wasm");
    let (r, _dir) = trigger_registry(&[
        ("a-broken.wasm", junk.path().to_path_buf()),
        ("b-cron.wasm", trigger_component("plugins/cron.wasm")),
        ("c-cron-again.wasm", trigger_component("plugins/cron.wasm")),
        (
            "d-dup-schedule.wasm",
            trigger_component("builtin/schedule.wasm"),
        ),
        ("e-looping.wasm", trigger_component("testing/looping.wasm")),
        (
            "f-bad.wasm",
            trigger_component("testing/bad-descriptor.wasm"),
        ),
        ("g-a-node.wasm", node),
    ]);
    let entries: Vec<_> = r
        .entries()
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                e.available,
                e.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    let find = |name: &str| {
        entries
            .iter()
            .find(|e| e.0 == name)
            .unwrap_or_else(|| panic!("{name} in {entries:?}"))
            .clone()
    };
    assert!(find("schedule@1").1 && find("manual@1").1);
    assert!(find("a-broken.wasm")
        .2
        .contains("not a valid WebAssembly component"));
    let crons: Vec<_> = entries.iter().filter(|e| e.0 == "cron@1").collect();
    assert_eq!(crons.len(), 2);
    assert!(crons[0].1, "the first cron@1 is available");
    assert!(
        !crons[1].1 && crons[1].2.contains("duplicates cron@1"),
        "{crons:?}"
    );
    let dup = entries
        .iter()
        .filter(|e| e.0 == "schedule@1")
        .nth(1)
        .unwrap();
    assert!(
        !dup.1
            && dup
                .2
                .contains("duplicates schedule@1 from the built-in source"),
        "{dup:?}"
    );
    let looping = find("e-looping.wasm");
    assert!(
        !looping.1 && looping.2.contains("guest_timeout"),
        "{looping:?}"
    );
    let bad = find("f-bad.wasm");
    assert!(!bad.1 && bad.2.contains("descriptor.id"), "{bad:?}");
    let node = find("g-a-node.wasm");
    assert!(
        !node.1 && node.2.contains("trigger-source world"),
        "{node:?}"
    );

    // The others keep working; the broken ones cannot be selected.
    let now = t("2026-11-30T09:00:00Z");
    let p = r
        .preview("cron@1", &json!({"expression": "0 * * * *"}), now, 2)
        .unwrap();
    assert_eq!(p.fires.len(), 2);
    let p = r
        .preview("schedule@1", &json!({"every": "1h"}), now, 2)
        .unwrap();
    assert_eq!(p.fires.len(), 2);
    assert!(matches!(
        r.get("nope@1"),
        Err(TriggerError::UnknownSource(_))
    ));
    assert!(matches!(r.get("schedule"), Err(TriggerError::Input { .. })));
}

#[test]
fn plugin_calls_run_under_the_time_limit() {
    // bad-descriptor's prepare loops forever: called directly, outside the
    // registry, it is stopped like a node.
    let engine = stepwell_tests::strict_engine(std::time::Duration::from_millis(300), 64);
    let bytes = std::fs::read(trigger_component("testing/bad-descriptor.wasm")).unwrap();
    let source = engine
        .load_trigger_bytes(&bytes, "bad.wasm".as_ref())
        .unwrap();
    let binding = stepwell::triggers::Binding {
        binding_id: "b".into(),
        source_id: "bad".into(),
        source_version: 1,
        config: json!({}),
    };
    let err = source
        .prepare(&binding, &json!({}), "2026-11-30T09:00:00Z", &[])
        .unwrap_err();
    assert_eq!(err.reason_code(), "guest_timeout", "{err}");
}

#[test]
fn missing_plugin_folder_is_an_input_error() {
    let err = TriggerRegistry::load(&engine(), Some("/no/such/folder".as_ref())).unwrap_err();
    assert_eq!(err.reason_code(), "invalid_input");
    assert!(err.to_string().contains("/no/such/folder"));
}

fn validate(config: Value) -> Result<Value, TriggerError> {
    registry().call(
        "schedule@1",
        "validate",
        &json!({"config": config, "now": "2026-11-30T09:00:00+01:00"}),
        Utc::now(),
    )
}

#[test]
fn schedule_validation_names_the_field() {
    let ok = validate(json!({"every": "15m"})).unwrap();
    assert_eq!(
        ok,
        json!({"start_at": "2026-11-30T08:00:00+00:00", "anchor": "2026-11-30T08:00:00+00:00", "every": "15m"}),
        "start_at defaults to the creation time, anchor to start_at"
    );
    let cases = [
        (
            json!({"every": "0m"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"every": "15"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"every": "1w"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"every": "01h"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"every": "367d"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"every": "8785h"}),
            "trigger.config.every",
            "invalid_definition",
        ),
        (
            json!({"start_at": "2026-11-30T09:00:00"}),
            "trigger.config.start_at",
            "invalid_definition",
        ),
        (
            json!({"start_at": "2026-11-30T09:00:00Z", "until": "2026-11-30T09:00:00Z"}),
            "trigger.config.until",
            "invalid_definition",
        ),
        (
            json!({"count": 0}),
            "trigger.config.count",
            "invalid_definition",
        ),
        (
            json!({"count": 1000001, "every": "1s"}),
            "trigger.config.count",
            "invalid_definition",
        ),
        (
            json!({"count": 2}),
            "trigger.config.count",
            "invalid_definition",
        ),
        (
            json!({"count": "3", "every": "1s"}),
            "trigger.config.count",
            "invalid_definition",
        ),
        (
            json!({"anchor": "2026-01-01T00:00:00Z", "every": "1h"}),
            "trigger.config.anchor",
            "unsupported_feature",
        ),
        (
            json!({"cron": "* * * * *"}),
            "trigger.config.cron",
            "invalid_definition",
        ),
    ];
    for (config, field, code) in cases {
        match validate(config.clone()) {
            Err(e @ (TriggerError::Invalid { .. } | TriggerError::Unsupported { .. })) => {
                assert_eq!(e.reason_code(), code, "{config}: {e}");
                assert_eq!(e.to_json()["field"], field, "{config}: {e}");
            }
            other => panic!("{config} should be refused, got {other:?}"),
        }
    }
    assert!(validate(json!({"every": "366d", "count": 1000000})).is_ok());
    assert!(validate(json!({"count": 1})).is_ok());
}

#[test]
fn manual_fires_only_when_asked() {
    let r = registry();
    let now = Utc::now();
    assert_eq!(
        r.call("manual@1", "validate", &json!({"config": {}}), now)
            .unwrap(),
        json!({})
    );
    let err = r
        .call(
            "manual@1",
            "validate",
            &json!({"config": {"every": "1h"}}),
            now,
        )
        .unwrap_err();
    assert_eq!(err.to_json()["field"], "trigger.config.every");
    let b = json!({"binding_id": "b1", "config": {}});
    assert_eq!(
        r.call(
            "manual@1",
            "prepare",
            &json!({"binding": b, "state": {}}),
            now
        )
        .unwrap(),
        json!({"kind": "idle"})
    );
    let admitted = r
        .call(
            "manual@1",
            "admit",
            &json!({"binding": b, "state": {}}),
            now,
        )
        .unwrap();
    assert_eq!(admitted["admission"], Value::Null);
    let env = r
        .call(
            "manual@1",
            "normalize",
            &json!({"binding": b, "event_id": "manual:cmd-7", "fired_at": "2026-11-30T09:00:00Z", "payload": {"by": "me"}}),
            now,
        )
        .unwrap();
    assert_eq!(
        env,
        json!({"event_id": "manual:cmd-7", "source_id": "manual", "source_version": 1,
               "fired_at": "2026-11-30T09:00:00Z", "payload": {"by": "me"}, "binding_id": "b1"})
    );
    let err = r
        .call(
            "manual@1",
            "normalize",
            &json!({"binding": b, "event_id": "cmd-7", "fired_at": "x"}),
            now,
        )
        .unwrap_err();
    assert_eq!(err.to_json()["field"], "event_id");
    let p = r.preview("manual@1", &json!({}), now, 3).unwrap();
    assert_eq!((p.fires.len(), p.end), (0, "idle"));
}

#[test]
fn schedule_coalesces_missed_ticks_into_one_admission() {
    let r = registry();
    let b = json!({"binding_id": "b1", "config": {"start_at": "2026-11-30T09:00:00Z", "anchor": "2026-11-30T09:00:00Z", "every": "1h"}});
    let call = |m: &str, input: Value| r.call("schedule@1", m, &input, Utc::now()).unwrap();
    let state = call("initial-state", json!({"binding": b}));
    assert_eq!(
        call("prepare", json!({"binding": b, "state": state})),
        json!({"kind": "until", "until": "2026-11-30T09:00:00+00:00"})
    );
    // Down from 08:00 to 13:30: ticks 0..=4 were due; one admission, for 4.
    let out = call(
        "admit",
        json!({"binding": b, "state": state, "now": "2026-11-30T13:30:00Z"}),
    );
    assert_eq!(out["admission"]["event_id"], "schedule@1:b1:4");
    assert_eq!(
        out["admission"]["payload"],
        json!({"tick": 4, "scheduled_at": "2026-11-30T13:00:00+00:00",
               "coalesced": {"first_tick": 0, "last_tick": 4, "missed_count": 4}})
    );
    // The grid did not drift: the next tick is 14:00, not 14:30.
    let next = call("prepare", json!({"binding": b, "state": out["state"]}));
    assert_eq!(
        next,
        json!({"kind": "until", "until": "2026-11-30T14:00:00+00:00"})
    );
    // On time: no coalesced block.
    let on_time = call(
        "admit",
        json!({"binding": b, "state": out["state"], "now": "2026-11-30T14:00:07Z"}),
    );
    assert_eq!(
        on_time["admission"]["payload"],
        json!({"tick": 5, "scheduled_at": "2026-11-30T14:00:00+00:00"})
    );
    // rearm skips every tick at or before now and admits nothing.
    let rearmed = call(
        "rearm",
        json!({"binding": b, "state": on_time["state"], "now": "2026-11-30T18:00:00Z"}),
    );
    assert_eq!(
        rearmed,
        json!({"anchor": "2026-11-30T09:00:00+00:00", "tick": 10, "scheduled_count": 2, "exhausted": false})
    );
    let nothing = call(
        "admit",
        json!({"binding": b, "state": rearmed, "now": "2026-11-30T18:59:59Z"}),
    );
    assert_eq!(nothing["admission"], Value::Null);
}

/// The expected behaviour, computed independently of the component.
struct Model {
    anchor: i64,
    every: Option<i64>,
    until: Option<i64>,
    count: Option<u64>,
    next: u64,
    admitted: u64,
}

impl Model {
    fn tick(&self, k: u64) -> Option<i64> {
        let t = match self.every {
            None if k > 0 => return None,
            None => self.anchor,
            Some(e) => self.anchor + k as i64 * e,
        };
        (self.until.is_none_or(|u| t < u)).then_some(t)
    }
    /// The last existing tick at or before `now`.
    fn last_due(&self, now: i64) -> Option<u64> {
        if now < self.anchor {
            return None;
        }
        let mut k = match self.every {
            None => 0,
            Some(e) => ((now - self.anchor) / e) as u64,
        };
        while k > 0 && self.tick(k).is_none() {
            k -= 1;
        }
        self.tick(k).map(|_| k)
    }
    fn exhausted(&self) -> bool {
        self.count.is_some_and(|c| self.admitted >= c) || self.tick(self.next).is_none()
    }
}

fn secs(s: &str) -> i64 {
    t(s).timestamp()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random configs and random clocks: every admission is on the grid, one
    /// per call however many ticks were missed, with exact coalesced counts;
    /// `count` and `until` are exact; `rearm` never fires the past.
    #[test]
    fn schedule_follows_its_grid(
        start_off in 0i64..(30 * 86_400),
        n in 1i64..120,
        unit in prop::sample::select(vec![1i64, 60, 3_600, 86_400]),
        one_shot in any::<bool>(),
        count in prop::option::of(1u64..12),
        until_ticks in prop::option::of(1i64..40),
        steps in prop::collection::vec((0i64..4, 0i64..1_000, any::<bool>()), 1..40),
    ) {
        let r = registry();
        let every = if one_shot { None } else { Some(n * unit) };
        let count = if every.is_none() { count.map(|_| 1) } else { count };
        let anchor = secs("2026-01-01T00:00:00Z") + start_off;
        let until = until_ticks.map(|k| anchor + k * every.unwrap_or(3_600));
        let mut config = json!({"start_at": fmt(Utc.timestamp_opt(anchor, 0).unwrap())});
        if let Some(e) = every { config["every"] = json!(format!("{}{}", e / unit, match unit { 1 => "s", 60 => "m", 3_600 => "h", _ => "d" })); }
        if let Some(u) = until { config["until"] = json!(fmt(Utc.timestamp_opt(u, 0).unwrap())); }
        if let Some(c) = count { config["count"] = json!(c); }
        let call = |m: &str, input: Value| r.call("schedule@1", m, &input, Utc::now());
        let validated = call("validate", json!({"config": config, "now": fmt(Utc.timestamp_opt(anchor - 10, 0).unwrap())})).unwrap();
        let b = json!({"binding_id": "bb", "config": validated});
        let mut state = call("initial-state", json!({"binding": b})).unwrap();
        let mut model = Model { anchor, every, until, count, next: 0, admitted: 0 };
        let mut now = anchor - 5;
        let span = every.unwrap_or(3_600);
        for (jumps, jitter, pause) in steps {
            now += jumps * span + jitter * span / 1_000;
            let now_s = fmt(Utc.timestamp_opt(now, 0).unwrap());
            if pause {
                // A paused automation resumed now: no catch-up.
                state = call("rearm", json!({"binding": b, "state": state, "now": now_s})).unwrap();
                // The first tick strictly after now (past `until`: exhausted).
                if now >= anchor {
                    let passed = every.map_or(0, |e| ((now - anchor) / e) as u64);
                    model.next = model.next.max(passed + 1);
                }
                let again = call("admit", json!({"binding": b, "state": state, "now": now_s})).unwrap();
                prop_assert_eq!(&again["admission"], &Value::Null, "rearm left something due at {}", now_s);
                match call("prepare", json!({"binding": b, "state": state, "now": now_s})).unwrap() {
                    w if w["kind"] == "until" => prop_assert!(secs(w["until"].as_str().unwrap()) > now, "prepare after rearm: {}", w),
                    w => prop_assert_eq!(&w["kind"], "exhausted"),
                }
                continue;
            }
            let out = call("admit", json!({"binding": b, "state": state, "now": now_s})).unwrap();
            let expected = if model.exhausted() { None } else { model.last_due(now).filter(|k| *k >= model.next) };
            match (expected, &out["admission"]) {
                (None, Value::Null) => {}
                (Some(last), a) => {
                    prop_assert_eq!(&a["event_id"], &json!(format!("schedule@1:bb:{last}")));
                    let p = &a["payload"];
                    prop_assert_eq!(&p["tick"], &json!(last));
                    prop_assert_eq!(secs(p["scheduled_at"].as_str().unwrap()), model.tick(last).unwrap(), "on the grid");
                    if last > model.next {
                        prop_assert_eq!(&p["coalesced"], &json!({"first_tick": model.next, "last_tick": last, "missed_count": last - model.next}));
                    } else {
                        prop_assert!(p.get("coalesced").is_none());
                    }
                    if let Some(u) = until { prop_assert!(model.tick(last).unwrap() < u, "until is exclusive"); }
                    model.next = last + 1;
                    model.admitted += 1;
                }
                (None, a) => prop_assert!(false, "unexpected admission {} at {}", a, now_s),
            }
            state = out["state"].clone();
            prop_assert_eq!(&state, &json!({"anchor": validated["anchor"], "tick": model.next,
                "scheduled_count": model.admitted, "exhausted": model.exhausted()}));
        }
        if let Some(c) = count { prop_assert!(model.admitted <= c, "count is a ceiling"); }
        // Run the clock far past everything: exactly as many admissions as the
        // model allows, then exhausted (when bounded).
        let far = now + 400 * 86_400 * 5;
        let out = call("admit", json!({"binding": b, "state": state, "now": fmt(Utc.timestamp_opt(far, 0).unwrap())})).unwrap();
        let expected = if model.exhausted() { None } else { model.last_due(far).filter(|k| *k >= model.next) };
        prop_assert_eq!(out["admission"].is_null(), expected.is_none());
        if let Some(k) = expected { model.next = k + 1; model.admitted += 1; }
        if count.is_some() || until.is_some() || every.is_none() {
            let w = call("prepare", json!({"binding": b, "state": out["state"]})).unwrap();
            if model.exhausted() { prop_assert_eq!(&w["kind"], "exhausted"); }
        }
    }
}

#[test]
fn count_and_until_are_exact_at_their_boundaries() {
    let r = registry();
    let from = t("2026-11-30T09:00:00Z");
    let p = r
        .preview(
            "schedule@1",
            &json!({"start_at": "2026-11-30T09:00:00Z", "every": "10m", "count": 3}),
            from,
            10,
        )
        .unwrap();
    assert_eq!(p.fires.len(), 3);
    assert_eq!(p.end, "exhausted");
    // until is exclusive: a tick exactly at until does not fire.
    let p = r
        .preview("schedule@1", &json!({"start_at": "2026-11-30T09:00:00Z", "every": "10m", "until": "2026-11-30T09:30:00Z"}), from, 10)
        .unwrap();
    let at: Vec<_> = p
        .fires
        .iter()
        .map(|f| f.payload["scheduled_at"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        at,
        [
            "2026-11-30T09:00:00+00:00",
            "2026-11-30T09:10:00+00:00",
            "2026-11-30T09:20:00+00:00"
        ]
    );
    // Without every: one firing, at start_at.
    let p = r
        .preview(
            "schedule@1",
            &json!({"start_at": "2026-12-01T00:00:00+01:00"}),
            from,
            10,
        )
        .unwrap();
    assert_eq!(p.fires.len(), 1);
    assert_eq!(
        p.fires[0].payload["scheduled_at"],
        "2026-11-30T23:00:00+00:00"
    );
}

fn cron_registry() -> (TriggerRegistry, tempfile::TempDir) {
    trigger_registry(&[("cron.wasm", trigger_component("plugins/cron.wasm"))])
}

fn cron_fires(
    r: &TriggerRegistry,
    expr: &str,
    tz: &str,
    from: &str,
    n: usize,
) -> Vec<(DateTime<Utc>, String)> {
    let p = r
        .preview(
            "cron@1",
            &json!({"expression": expr, "timezone": tz}),
            t(from),
            n,
        )
        .unwrap();
    p.fires
        .iter()
        .map(|f| {
            (
                t(f.payload["scheduled_at"].as_str().unwrap()),
                f.payload["local_time"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn cron_handles_the_daylight_saving_gap_and_repeat() {
    let (r, _d) = cron_registry();
    // Europe/Paris springs forward on 2026-03-29 at 02:00 (to 03:00): 02:30
    // does not exist that day and fires at 03:00 CEST.
    let f = cron_fires(&r, "30 2 * * *", "Europe/Paris", "2026-03-28T00:00:00Z", 3);
    let local: Vec<_> = f.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(
        local,
        [
            "2026-03-28T02:30:00+01:00",
            "2026-03-29T03:00:00+02:00",
            "2026-03-30T02:30:00+02:00"
        ]
    );
    // It falls back on 2026-10-25 at 03:00 (to 02:00): 02:30 happens twice
    // and fires once, at the first.
    let f = cron_fires(&r, "30 2 * * *", "Europe/Paris", "2026-10-24T12:00:00Z", 2);
    assert_eq!(f[0].0, t("2026-10-25T00:30:00Z"));
    assert_eq!(f[1].0, t("2026-10-26T01:30:00Z"));
    // Every weekday at 09:00 Paris time, across the change: 08:00Z in winter,
    // 07:00Z in summer.
    let f = cron_fires(&r, "0 9 * * 1-5", "Europe/Paris", "2026-03-26T00:00:00Z", 4);
    let utc: Vec<_> = f.iter().map(|x| fmt(x.0)).collect();
    assert_eq!(
        utc,
        [
            "2026-03-26T08:00:00Z",
            "2026-03-27T08:00:00Z",
            "2026-03-30T07:00:00Z",
            "2026-03-31T07:00:00Z"
        ]
    );
    // New York, an hourly expression over the November repeat: the repeated
    // 01:00 fires once.
    let f = cron_fires(
        &r,
        "0 * * * *",
        "America/New_York",
        "2026-11-01T03:30:00Z",
        4,
    );
    let local: Vec<_> = f.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(
        local,
        [
            "2026-11-01T00:00:00-04:00",
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T02:00:00-05:00",
            "2026-11-01T03:00:00-05:00"
        ]
    );
}

#[test]
fn cron_validation_names_the_field() {
    let (r, _d) = cron_registry();
    for (config, field) in [
        (
            json!({"expression": "0 9 * *"}),
            "trigger.config.expression",
        ),
        (
            json!({"expression": "61 9 * * *"}),
            "trigger.config.expression",
        ),
        (
            json!({"expression": "0 9 * * MON-XYZ"}),
            "trigger.config.expression",
        ),
        (
            json!({"expression": "0 9 * * *", "timezone": "Mars/Olympus"}),
            "trigger.config.timezone",
        ),
        (json!({"timezone": "UTC"}), "trigger.config.expression"),
        (
            json!({"expression": "0 9 * * *", "every": "1h"}),
            "trigger.config.every",
        ),
    ] {
        let err = r
            .call("cron@1", "validate", &json!({"config": config}), Utc::now())
            .unwrap_err();
        assert_eq!(err.to_json()["field"], field, "{config}: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// A daily cron fires exactly once on every local day of a year, whatever
    /// the daylight-saving transitions, at the expression's wall time except
    /// when that time does not exist (then right after the gap).
    #[test]
    fn a_daily_cron_fires_once_per_local_day(
        minute in 0u32..60,
        hour in 0u32..24,
        tz in prop::sample::select(vec!["Europe/Paris", "America/New_York", "Australia/Sydney", "UTC"]),
        start_day in 0i64..365,
    ) {
        let (r, _d) = cron_registry();
        let from = t("2026-01-01T12:00:00Z") + Duration::days(start_day);
        let tzv: chrono_tz::Tz = tz.parse().unwrap();
        let fires = cron_fires(&r, &format!("{minute} {hour} * * *"), tz, &fmt(from), 370);
        prop_assert_eq!(fires.len(), 370);
        let mut days = std::collections::BTreeSet::new();
        for w in fires.windows(2) {
            prop_assert!(w[0].0 < w[1].0, "strictly increasing");
        }
        for (at, _) in &fires {
            let local = at.with_timezone(&tzv);
            prop_assert!(days.insert(local.date_naive()), "one firing per local day: {} twice", local.date_naive());
            let on_time = (local.hour(), local.minute()) == (hour, minute);
            // Otherwise the wall time did not exist: it fired at the end of
            // the gap, less than 3 hours later.
            let shifted = local.minute() == 0 && {
                let wall = local.date_naive().and_hms_opt(hour, minute, 0).unwrap();
                tzv.from_local_datetime(&wall).single().is_none()
                    && tzv.from_local_datetime(&wall).earliest().is_none()
            };
            prop_assert!(on_time || shifted, "{} local {} for {:02}:{:02}", at, local, hour, minute);
        }
        let consecutive = days.iter().zip(days.iter().skip(1)).all(|(a, b)| *b == a.succ_opt().unwrap());
        prop_assert!(consecutive, "no local day skipped");
    }
}

/// The same calls as the reference's adapters (abstractruntime 0.13.0), with
/// its answers: state slices, `fired_at` = the admitted tick's time,
/// coalescing, `until` exclusive, one-shots, `rearm`, and manual@1's
/// envelope under another source's binding.
#[test]
fn schedule_and_manual_answer_as_the_reference() {
    let r = registry();
    let t0 = "2026-01-01T00:00:00+00:00";
    let call = |source: &str, m: &str, input: Value| r.call(source, m, &input, Utc::now()).unwrap();
    let sched = |m: &str, input: Value| call("schedule@1", m, input);

    // The longest grid, counted: the second tick is a year and a day later.
    let cfg = sched(
        "validate",
        json!({"config": {"every": "366d", "count": 1_000_000}, "now": t0}),
    );
    let b = json!({"binding_id": "b1", "config": cfg});
    let st = sched("initial-state", json!({"binding": b}));
    let a = sched("admit", json!({"binding": b, "state": st, "now": t0}));
    assert_eq!(
        a,
        json!({"admission": {"event_id": "schedule@1:b1:0", "fired_at": t0,
                             "payload": {"scheduled_at": t0, "tick": 0}},
               "state": {"anchor": t0, "exhausted": false, "scheduled_count": 1, "tick": 1}})
    );
    assert_eq!(
        sched(
            "prepare",
            json!({"binding": b, "state": a["state"], "now": t0})
        ),
        json!({"kind": "until", "until": "2027-01-02T00:00:00+00:00"})
    );

    // Every 2m: on time, late, and three ticks missed.
    let cfg = sched(
        "validate",
        json!({"config": {"start_at": t0, "every": "2m"}, "now": t0}),
    );
    let b = json!({"binding_id": "b1", "config": cfg});
    let st = sched("initial-state", json!({"binding": b}));
    assert_eq!(
        st,
        json!({"anchor": t0, "exhausted": false, "scheduled_count": 0, "tick": 0})
    );
    let a1 = sched("admit", json!({"binding": b, "state": st, "now": t0}));
    let a2 = sched(
        "admit",
        json!({"binding": b, "state": a1["state"], "now": "2026-01-01T00:02:30+00:00"}),
    );
    assert_eq!(
        a2,
        json!({"admission": {"event_id": "schedule@1:b1:1", "fired_at": "2026-01-01T00:02:00+00:00",
                             "payload": {"scheduled_at": "2026-01-01T00:02:00+00:00", "tick": 1}},
               "state": {"anchor": t0, "exhausted": false, "scheduled_count": 2, "tick": 2}})
    );
    let a3 = sched(
        "admit",
        json!({"binding": b, "state": a2["state"], "now": "2026-01-01T00:11:00+00:00"}),
    );
    let coalesced = json!({"first_tick": 2, "last_tick": 5, "missed_count": 3});
    assert_eq!(
        a3,
        json!({"admission": {"event_id": "schedule@1:b1:5", "fired_at": "2026-01-01T00:10:00+00:00",
                             "payload": {"coalesced": coalesced, "scheduled_at": "2026-01-01T00:10:00+00:00", "tick": 5}},
               "state": {"anchor": t0, "exhausted": false, "scheduled_count": 3, "tick": 6}})
    );
    assert_eq!(
        sched(
            "normalize",
            json!({"binding": {"binding_id": "b1", "config": cfg}, "event_id": "schedule@1:b1:5",
                                  "fired_at": "2026-01-01T00:10:00+00:00", "payload": a3["admission"]["payload"]})
        ),
        json!({"binding_id": "b1", "event_id": "schedule@1:b1:5", "fired_at": "2026-01-01T00:10:00+00:00",
               "payload": {"coalesced": coalesced, "scheduled_at": "2026-01-01T00:10:00+00:00", "tick": 5},
               "source_id": "schedule", "source_version": 1})
    );
    assert_eq!(
        sched(
            "prepare",
            json!({"binding": b, "state": a3["state"], "now": "2026-01-01T00:11:00+00:00"})
        ),
        json!({"kind": "until", "until": "2026-01-01T00:12:00+00:00"})
    );
    assert_eq!(
        sched(
            "rearm",
            json!({"binding": b, "state": a3["state"], "now": "2026-01-01T00:30:00+00:00"})
        ),
        json!({"anchor": t0, "exhausted": false, "scheduled_count": 3, "tick": 16})
    );

    // A one-shot at 01:00.
    let at1 = "2026-01-01T01:00:00+00:00";
    let cfg = sched(
        "validate",
        json!({"config": {"start_at": "2026-01-01T01:00:00Z"}, "now": t0}),
    );
    let b = json!({"binding_id": "b2", "config": cfg});
    let st = sched("initial-state", json!({"binding": b}));
    assert_eq!(
        sched("prepare", json!({"binding": b, "state": st, "now": t0})),
        json!({"kind": "until", "until": at1})
    );
    assert_eq!(
        sched("admit", json!({"binding": b, "state": st, "now": t0})).get("admission"),
        Some(&Value::Null)
    );
    let a = sched(
        "admit",
        json!({"binding": b, "state": st, "now": "2026-01-01T01:00:05+00:00"}),
    );
    assert_eq!(
        a,
        json!({"admission": {"event_id": "schedule@1:b2:0", "fired_at": at1,
                             "payload": {"scheduled_at": at1, "tick": 0}},
               "state": {"anchor": at1, "exhausted": true, "scheduled_count": 1, "tick": 1}})
    );
    assert_eq!(
        sched(
            "prepare",
            json!({"binding": b, "state": a["state"], "now": t0})
        ),
        json!({"kind": "exhausted"})
    );
    assert_eq!(
        sched(
            "rearm",
            json!({"binding": b, "state": st, "now": "2026-01-01T02:00:00+00:00"})
        ),
        json!({"anchor": at1, "exhausted": true, "scheduled_count": 0, "tick": 1})
    );

    // until is exclusive; an admission past it takes the last tick before it.
    let cfg = sched(
        "validate",
        json!({"config": {"start_at": t0, "every": "10m", "until": "2026-01-01T00:30:00Z"}, "now": t0}),
    );
    let b = json!({"binding_id": "b3", "config": cfg});
    let st = sched("initial-state", json!({"binding": b}));
    let coalesced = json!({"first_tick": 0, "last_tick": 2, "missed_count": 2});
    assert_eq!(
        sched(
            "admit",
            json!({"binding": b, "state": st, "now": "2026-01-01T05:00:00+00:00"})
        ),
        json!({"admission": {"event_id": "schedule@1:b3:2", "fired_at": "2026-01-01T00:20:00+00:00",
                             "payload": {"coalesced": coalesced, "scheduled_at": "2026-01-01T00:20:00+00:00", "tick": 2}},
               "state": {"anchor": t0, "exhausted": true, "scheduled_count": 1, "tick": 3}})
    );

    // A grid that runs past the year 9999 is exhausted there (no timestamp
    // can spell the next tick).
    let cfg = sched(
        "validate",
        json!({"config": {"start_at": "9999-12-29T00:00:00Z", "every": "1d"}, "now": t0}),
    );
    let b = json!({"binding_id": "b4", "config": cfg});
    let late = json!({"anchor": "9999-12-29T00:00:00+00:00", "tick": 2, "scheduled_count": 2, "exhausted": false});
    assert_eq!(
        sched("prepare", json!({"binding": b, "state": late, "now": t0})),
        json!({"kind": "until", "until": "9999-12-31T00:00:00+00:00"})
    );
    let mut past = late.clone();
    past["tick"] = json!(3);
    assert_eq!(
        sched("prepare", json!({"binding": b, "state": past, "now": t0})),
        json!({"kind": "exhausted"})
    );

    // manual@1: the trigger slice, and run-now envelopes under the
    // automation's own (here: schedule) binding.
    let manual = |m: &str, input: Value| call("manual@1", m, input);
    let mb = json!({"binding_id": "b1", "config": {}});
    assert_eq!(
        manual("initial-state", json!({"binding": mb})),
        json!({"anchor": null, "exhausted": false, "scheduled_count": 0, "tick": 0})
    );
    assert_eq!(
        manual(
            "rearm",
            json!({"binding": mb, "state": {"anchor": "x", "tick": 3, "scheduled_count": 2, "exhausted": true}})
        ),
        json!({"anchor": "x", "exhausted": false, "scheduled_count": 2, "tick": 3})
    );
    assert_eq!(
        manual(
            "normalize",
            json!({"binding": {"binding_id": "b1", "source_id": "schedule", "source_version": 1, "config": {}},
                                   "event_id": "manual:c9", "fired_at": "2026-01-01T00:06:00+00:00",
                                   "payload": {"command_id": "c9"}})
        ),
        json!({"binding_id": "b1", "event_id": "manual:c9", "fired_at": "2026-01-01T00:06:00+00:00",
               "payload": {"command_id": "c9"}, "source_id": "manual", "source_version": 1})
    );
}

/// A feed on loopback with `items` items; with `gate`, each answer waits
/// until the gate is opened (a feed that is slow to answer).
fn feed_server(items: u32, gate: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/feed.xml", listener.local_addr().unwrap());
    let entries: String = (1..=items)
        .map(|i| format!("<item><title>Item {i}</title><guid>item-{i}</guid></item>"))
        .collect();
    let body = format!(
        "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>t</title>\
         <link>https://example.org</link><description>d</description>{entries}</channel></rss>"
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (gate, body) = (gate.clone(), body.clone());
            std::thread::spawn(move || {
                let _ = stream.read(&mut [0u8; 4096]);
                while gate
                    .as_ref()
                    .is_some_and(|g| !g.load(std::sync::atomic::Ordering::SeqCst))
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/rss+xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    url
}

/// `feed_once` (what `stepwell drive --once` runs) polls the due feeds at
/// once: a feed that does not answer holds only its own poll, and one made
/// after it is polled meanwhile.
#[test]
fn a_slow_feed_does_not_hold_the_others_in_one_pass() {
    use stepwell::triggers::Connections;
    let dir = tempfile::tempdir().unwrap();
    let store =
        std::sync::Arc::new(stepwell::SqliteStore::open(dir.path().join("db.sqlite")).unwrap());
    let rt = stepwell::builder(store)
        .engine(engine())
        .plugin(std::sync::Arc::new(stepwell::triggers::Triggers::new()))
        .build()
        .unwrap();
    let gate = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let config = |url: String| json!({"url": url, "every": "1h", "initial_items": "deliver"});
    // Polled in the order they were made: the slow one first.
    let slow = rt
        .create_connection(
            "feed.item@1",
            None,
            &config(feed_server(1, Some(gate.clone()))),
        )
        .unwrap();
    let quick = rt
        .create_connection("feed.item@1", None, &config(feed_server(3, None)))
        .unwrap();
    let (slow, quick) = (slow.connection_id, quick.connection_id);
    let pass = {
        let rt = rt.clone();
        std::thread::spawn(move || stepwell::triggers::feed_once(&rt).unwrap())
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt.connection_events(&quick, 0, 10).unwrap().len() < 3 {
        assert!(
            std::time::Instant::now() < until,
            "the quick feed was not polled while the slow one held its answer"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(rt.connection_events(&slow, 0, 10).unwrap().is_empty());
    gate.store(true, std::sync::atomic::Ordering::SeqCst);
    let report = pass.join().unwrap();
    assert_eq!(report.polled, vec![(slow.clone(), 1), (quick, 3)]);
    assert_eq!(rt.connection_events(&slow, 0, 10).unwrap().len(), 1);
}

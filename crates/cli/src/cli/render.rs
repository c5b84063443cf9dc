//! How the binary prints what a command returns: a run, a ledger record,
//! as text or as JSON; and the exit status a failed run
//! gives the command.

use std::sync::atomic::{AtomicBool, Ordering};

use stepwell::{RunState, RunStatus, WaitReason};

/// Whether a run this command executed ended `failed` (the command then
/// exits 1, having printed the run as usual).
static RUN_FAILED: AtomicBool = AtomicBool::new(false);

/// Notes how a run that `run` or `resume` executed ended.
pub(crate) fn note_outcome(state: &RunState) {
    if state.status == RunStatus::Failed {
        note_failure();
    }
}

/// Makes the command exit 1 (something it moved failed), having printed
/// as usual.
pub(crate) fn note_failure() {
    RUN_FAILED.store(true, Ordering::Relaxed);
}

/// Whether [`note_failure`] was called.
pub(crate) fn failed() -> bool {
    RUN_FAILED.load(Ordering::Relaxed)
}

/// Prints one ledger record: a line, or its JSON.
pub(crate) fn print_record(r: &stepwell::StepRecord, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let what = match (&r.effect, &r.result) {
        (Some(e), _) => e.kind.clone(),
        (None, Some(v)) if v.get("resumed").is_some() => "resume".into(),
        (None, Some(v)) if v.get("due").is_some() => "due".into(),
        _ => "node".into(),
    };
    let detail = r
        .error
        .clone()
        .or_else(|| r.result.as_ref().map(|v| v.to_string()))
        .unwrap_or_default();
    println!(
        "{}  {:10} {:16} {:18} {}",
        r.started_at,
        r.status.as_str(),
        r.node_id.as_deref().unwrap_or("-"),
        what,
        detail
    );
}

/// Prints a run: its state as lines, or as JSON.
pub(crate) fn print_run(run: &RunState, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(run).unwrap_or_default());
        return;
    }
    println!(
        "run {}  workflow {}  status {}",
        run.run_id,
        run.workflow_id,
        run.status.as_str()
    );
    if let Some(w) = &run.waiting {
        println!("waiting: {}  key {}", w.reason.as_str(), w.wait_key);
        if let Some(p) = &w.prompt {
            println!("prompt: {p}");
        }
        if let Some(u) = &w.until {
            println!("until: {u}");
        }
        let approval = w
            .details
            .as_ref()
            .is_some_and(|d| d["mode"] == "approval_required");
        match w.reason {
            WaitReason::User if approval => println!(
                "approve with: stepwell resume {id} --payload '{{\"approved\": true}}'  (or {{\"approved\": false, \"reason\": \"...\"}})",
                id = run.run_id
            ),
            WaitReason::User => println!(
                "resume with: stepwell resume {} --payload '{{\"text\": \"...\"}}'",
                run.run_id
            ),
            WaitReason::Until => println!("the driver resumes it when due: stepwell drive"),
            WaitReason::Subworkflow => {
                println!("the driver resumes it when the child ends: stepwell drive")
            }
            _ => println!("resume with: stepwell resume {} --payload JSON", run.run_id),
        }
    }
    if let Some(out) = &run.output {
        println!("output: {out}");
    }
    if let Some(err) = &run.error {
        println!("error: {err}");
    }
}

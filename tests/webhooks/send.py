"""Sends webhook calls signed by the Standard Webhooks reference library.

Usage: send.py URL < calls.json, where calls.json is a list of
{"id", "body" (text), "secret", "age_s"?, "content_type"?, "raw_hex"?}; prints
one JSON line per call: {"id", "status", "answer"}.
"""
import datetime
import json
import sys
import urllib.error
import urllib.request

from standardwebhooks.webhooks import Webhook

url = sys.argv[1]
for call in json.load(sys.stdin):
    body = bytes.fromhex(call["raw_hex"]) if "raw_hex" in call else call["body"].encode("utf-8")
    at = datetime.datetime.now(tz=datetime.timezone.utc) - datetime.timedelta(seconds=call.get("age_s", 0))
    # The library signs text; a body that is not UTF-8 is signed as the
    # library would sign its bytes decoded as Latin-1 (same bytes).
    text = body.decode("utf-8") if "raw_hex" not in call else body.decode("latin-1")
    signature = Webhook(call["secret"]).sign(call["id"], at, text)
    if "raw_hex" in call:
        # Re-sign over the raw bytes (the library encodes text as UTF-8).
        import base64, hashlib, hmac
        key = base64.b64decode(call["secret"].split("_", 1)[1])
        signed = f"{call['id']}.{int(at.timestamp())}.".encode() + body
        signature = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "webhook-id": call["id"],
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "content-type": call.get("content_type", "application/json"),
    })
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    print(json.dumps({"id": call["id"], "status": status, "answer": json.loads(text)}), flush=True)

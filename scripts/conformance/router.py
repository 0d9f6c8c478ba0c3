"""What the conformance suites share: where the router and the engines are (environment set by
scripts/conformance.sh: INFERGATE_URL, INFERGATE_METRICS_URL, INFERGATE_CLIENT_KEY, ENGINES_M1 and ENGINES_M2), the
router's metrics, the engines' records of what reached them, and their health knobs."""

import contextlib
import json
import os
import re
import threading
import time
import urllib.request

ROUTER = os.environ["INFERGATE_URL"]
METRICS = os.environ["INFERGATE_METRICS_URL"]
POOLS = {model: os.environ[f"ENGINES_{model.upper()}"].split(",") for model in ("m1", "m2")}
KIB, MIB = 1024, 1024 * 1024
ID_HEADER = "x-conformance-id"  # tags a request so the engine's record of it can be found
CLIENT_KEY = os.environ["INFERGATE_CLIENT_KEY"]  # the one key of the router's `auth` section
SENT = {}  # request id -> body bytes the client put on the wire (filled by `record_sent`)

SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --- the router's metrics, the engines' records and knobs (urllib: the SDKs bring httpx or httpx2, by version)


def http(url, body=None):
    """GET `url`, or POST `body` as JSON; returns the response text (an HTTP error status raises)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def samples(name, **labels):
    """The values of the router's samples of `name` whose labels include `labels`."""
    for line in http(METRICS).splitlines():
        m = SAMPLE.match(line)
        if m and m[1] == name and labels.items() <= dict(LABEL.findall(m[2] or "")).items():
            yield float(m[3])


def metric(name, **labels):
    """Sum of the router's samples of `name` whose labels include `labels`."""
    return sum(samples(name, **labels))


def series(name, **labels):
    """How many of the router's samples of `name` have labels including `labels`."""
    return sum(1 for _ in samples(name, **labels))


def gauges():
    """(requests in flight, prefill tokens in flight) over every endpoint of the router."""
    return (
        metric("infergate_endpoint_requests_in_flight"),
        metric("infergate_endpoint_prefill_tokens"),
    )


def wait_for(what, cond, timeout=5.0):
    """Polls `cond` every 50 ms until it is true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def sim_total(model, key):
    """Sum of `key` of GET /sim/stats over the engines of pool `model`."""
    return sum(json.loads(http(f"{url}/sim/stats"))[key] for url in POOLS[model])


def set_health(model, status):
    """Makes every engine of pool `model` answer its health check with `status`."""
    for url in POOLS[model]:
        http(f"{url}/sim/control", {"health_status": status})


def healthy(model):
    return metric("infergate_endpoint_healthy", pool=model)


def records(rid, header=ID_HEADER):
    """(engine URL, record) of every engine record of a request whose `header` is `rid` (by default: the request
    tagged `rid`), over both pools."""
    return [
        (url, rec)
        for urls in POOLS.values()
        for url in urls
        for rec in json.loads(http(f"{url}/sim/requests"))
        if [header, rid] in rec["headers"]
    ]


def received(rid):
    """(engine URL, body bytes) of every engine record of request `rid`, over both pools."""
    return [(url, rec["body_len"]) for url, rec in records(rid)]


def assert_delivered(rid, model, nbytes):
    """Exactly one engine, of pool `model`, received request `rid`, with a body of `nbytes` bytes."""
    got = received(rid)
    assert len(got) == 1, f"request {rid} reached {len(got)} engines: {got}"
    url, body_len = got[0]
    assert url in POOLS[model], f"a {model} request reached {url}, not pool {model} {POOLS[model]}"
    assert body_len == nbytes, f"the engine got {body_len} body bytes of {nbytes}"


def text(nbytes):
    """`nbytes` of prompt text."""
    return ("conform " * (nbytes // 8 + 1))[:nbytes]


def record_sent(request):
    """An httpx request hook: notes the body size of a tagged request in SENT."""
    if ID_HEADER in request.headers:
        SENT[request.headers[ID_HEADER]] = len(request.content)


@contextlib.contextmanager
def pool_unhealthy_for(model, seconds):
    """Pool `model` fails its health checks until `seconds` after the block starts; the block runs once the router
    has taken every endpoint of the pool out of rotation. Health is restored and back in rotation on exit."""
    restore = threading.Timer(seconds, set_health, (model, 200))
    set_health(model, 500)
    try:
        wait_for(f"pool {model} out of rotation", lambda: healthy(model) == 0)
        restore.start()
        yield
    finally:
        restore.cancel()
        if restore.ident is not None:
            restore.join()
        set_health(model, 200)
        wait_for(f"pool {model} back in rotation", lambda: healthy(model) == len(POOLS[model]))


def learn_both_throughputs(model, stream_long):
    """predicted_ttft places by predicted cost once it has learned every endpoint's prefill speed from streamed
    answers: two long prompts streamed at once (`stream_long()`, one per engine, as load_aware places them) teach
    it."""
    pair = [threading.Thread(target=stream_long) for _ in range(2)]
    for t in pair:
        t.start()
    for t in pair:
        t.join()
    learned = "infergate_endpoint_ttft_throughput_tokens_per_second"
    wait_for("both speeds learned", lambda: series(learned, pool=model) == len(POOLS[model]))

"""Conformance of infergate with clients nobody on the project wrote: the official openai Python SDK (whichever
version this interpreter has; scripts/conformance.sh runs the file once per pinned version) and curl, against the
router in front of engine-sim.

Covers, through the SDK: chat completions with and without streaming, text completions, the Responses API with and
without streaming, stored responses (a chain by previous_response_id on one engine, retrieve, cancel, background
polling and cancel), a four-turn session staying on one engine and reusing its prefix cache (load_aware and
predicted_ttft; named by a header or by the SDK's prompt_cache_key), models.list(), 100 KiB and 1 MiB prompts for both models reaching one engine of the right pool
byte-complete, an unknown model raising openai.NotFoundError, a wrong key raising openai.AuthenticationError with
nothing reaching an engine (the right one goes as `Authorization: Bearer` on every call), the router's own 503 +
Retry-After retried by the SDK until the pool is healthy again (a pool with its health panic off), a pool whose
every health check fails served at once (its health panic), and a client that closes a stream after its first
chunk (the router's gauges return to 0 and the engine aborts).
Through curl: a 1 MiB body with `Expect: 100-continue` served without the client's 1 s wait for `100 Continue`,
and a 200 KiB chunked upload with `model` last routed to the right pool.

What the suites share (addresses, metrics, the engines' records): router.py.
"""

import json
import os
import ssl
import subprocess
import time
import uuid

import openai
import pytest

from router import (
    CLIENT_KEY,
    ID_HEADER,
    KIB,
    MIB,
    POOLS,
    ROUTER,
    SENT,
    assert_delivered,
    gauges,
    http,
    learn_both_throughputs,
    metric,
    pool_unhealthy_for,
    received,
    record_sent,
    sim_total,
    text,
    wait_for,
)

# --- helpers: SDK and curl requests --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    """An SDK client on the router that does not retry (tests that want retries ask for them)."""
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [record_sent]})
    with openai.OpenAI(
        base_url=f"{ROUTER}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30, http_client=http_client
    ) as c:
        yield c


def chat(client, model, content, **kw):
    """A tagged chat completion through the SDK; returns (request id, response or stream)."""
    rid = uuid.uuid4().hex
    kw.setdefault("max_tokens", 4)
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], extra_headers={ID_HEADER: rid}, **kw
    )
    return rid, resp


def chat_body(model, content, model_last=False):
    """A chat request body as bytes, with `model` first or last."""
    fields = {"max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    body = {**fields, "model": model} if model_last else {"model": model, **fields}
    return json.dumps(body).encode()


def curl(tmp_path, body, *headers):
    """POSTs `body` to the router's chat endpoint with curl: (request id, status, total seconds, response)."""
    rid = uuid.uuid4().hex
    (tmp_path / "body.json").write_bytes(body)
    cmd = ["curl", "-sS", "--max-time", "20", "-o", str(tmp_path / "response"), "-w", "%{http_code} %{time_total}"]
    for h in ("content-type: application/json", f"authorization: Bearer {CLIENT_KEY}", f"{ID_HEADER}: {rid}", *headers):
        cmd += ["-H", h]
    cmd += ["--data-binary", f"@{tmp_path / 'body.json'}", f"{ROUTER}/v1/chat/completions"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"curl exited {res.returncode}: {res.stderr}"
    status, seconds = res.stdout.split()
    return rid, int(status), float(seconds), (tmp_path / "response").read_text()


# --- SDK tests -----------------------------------------------------------------------------------------------

MODELS = pytest.mark.parametrize("model", ["m1", "m2"])


@MODELS
def test_chat_completion(client, model):
    rid, resp = chat(client, model, "hello")
    assert resp.model == model
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 4
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_chat_completion_streaming(client, model):
    rid, stream = chat(client, model, "hello", stream=True)
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_text_completion(client, model):
    rid = uuid.uuid4().hex
    resp = client.completions.create(model=model, prompt="hello", max_tokens=4, extra_headers={ID_HEADER: rid})
    assert resp.choices[0].text
    assert resp.choices[0].finish_reason == "length"
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_responses_api(client, model):
    """responses.create as the SDK sends it: `input` then `instructions`, `model` after them."""
    rid = uuid.uuid4().hex
    resp = client.responses.create(
        model=model, input="hello", instructions="be brief", max_output_tokens=4, extra_headers={ID_HEADER: rid}
    )
    assert resp.output_text
    assert resp.usage.output_tokens == 4
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_responses_api_streaming(client, model):
    rid = uuid.uuid4().hex
    stream = client.responses.create(
        model=model,
        input=[{"role": "user", "content": text(64 * KIB)}],
        max_output_tokens=4,
        stream=True,
        extra_headers={ID_HEADER: rid},
    )
    events = list(stream)
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert_delivered(rid, model, SENT[rid])
    wait_for("the router's gauges at 0 (requests, prefill tokens)", lambda: gauges() == (0, 0))


def final_response(stream):
    """The response object a Responses API stream ends with."""
    done = [e for e in stream if e.type == "response.completed"]
    assert len(done) == 1
    return done[0].response


@MODELS
def test_stored_responses_are_continued_retrieved_and_cancelled_on_their_engine(client, model):
    """The SDK's default `store` with engines that keep responses (vLLM's VLLM_ENABLE_RESPONSES_API_STORE; the
    engines here run with --responses-store): only the engine that made a response has it."""
    tags = [uuid.uuid4().hex for _ in range(6)]
    prev = client.responses.create(model=model, input="hello", max_output_tokens=4, extra_headers={ID_HEADER: tags[0]})
    chain = [prev.id]
    for i, tag in enumerate(tags[1:]):
        kw = dict(model=model, input=f"and then {i}?", previous_response_id=prev.id, max_output_tokens=4,
                  extra_headers={ID_HEADER: tag})
        # Streamed and not, in turn: the router learns the id from both.
        prev = final_response(client.responses.create(stream=True, **kw)) if i % 2 else client.responses.create(**kw)
        assert prev.output_text
        chain.append(prev.id)
    # Each turn continued the previous on its engine (another answers 404): one engine served the whole chain.
    served = {url for tag in tags for url, _ in received(tag)}
    assert len(served) == 1, f"the chain was served by {served}"
    for rid in chain:
        got = client.responses.retrieve(rid)
        assert (got.id, got.status) == (rid, "incomplete")
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(chain[-1])
    with pytest.raises(openai.NotFoundError, match="resp_never_made_here"):
        client.responses.retrieve("resp_never_made_here")


@MODELS
def test_a_background_response_is_polled_and_cancelled_on_its_engine(client, model):
    done = client.responses.create(model=model, input="hi", max_output_tokens=4, background=True)
    assert done.status in ("queued", "in_progress", "completed", "incomplete")
    wait_for("the background response to finish",
             lambda: client.responses.retrieve(done.id).status in ("completed", "incomplete"), timeout=10)
    # A long one, cancelled while it runs.
    long = client.responses.create(model=model, input="hi", max_output_tokens=2000, background=True)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"


def test_models_list(client):
    assert sorted(m.id for m in client.models.list()) == ["m1", "m2", "pd"]


def stream_long(client, model):
    """Streams the answer to a 400 KiB prompt (teaches predicted_ttft the speed of the engine that serves it)."""
    _, stream = chat(client, model, text(400 * KIB), stream=True)
    for _ in stream:
        pass


@pytest.mark.parametrize("named_by", ["header", "prompt_cache_key"])
@MODELS
def test_a_conversation_stays_on_its_engine_and_reuses_its_cache(client, model, named_by):
    """Four turns of one session, as an agent sends them through the SDK (the whole history each time, the session
    id in `extra_headers`, or as the SDK's own `prompt_cache_key` with no header): every turn reaches the engine of
    the first, and every later turn is served mostly from that engine's prefix cache. Pool m1 runs load_aware, m2
    predicted_ttft (the shipped policy)."""
    if model == "m2":
        learn_both_throughputs(model, lambda: stream_long(client, model))
    session = uuid.uuid4().hex
    messages = [{"role": "system", "content": text(16 * KIB)}]
    sticky = metric("infergate_placements_total", pool=model, reason="sticky")
    engines = []
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: " + text(2 * KIB)})
        rid = uuid.uuid4().hex
        named = (
            {"extra_headers": {ID_HEADER: rid, "x-session-id": session}}
            if named_by == "header"
            else {"extra_headers": {ID_HEADER: rid}, "prompt_cache_key": session}
        )
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=4, **named)
        messages.append({"role": "assistant", "content": resp.choices[0].message.content})
        engines += [url for url, _ in received(rid)]
        if turn > 0:
            cached = resp.usage.prompt_tokens_details.cached_tokens
            assert cached > resp.usage.prompt_tokens / 2, f"turn {turn}: {cached} of {resp.usage.prompt_tokens} cached"
    assert len(engines) == 4 and len(set(engines)) == 1, f"the turns reached {engines}"
    assert metric("infergate_placements_total", pool=model, reason="sticky") == sticky + 3


@MODELS
def test_models_retrieve(client, model):
    assert client.models.retrieve(model).id == model


def test_models_retrieve_unknown_raises_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("size", [100 * KIB, MIB], ids=["100KiB", "1MiB"])
@MODELS
def test_big_prompt_reaches_its_pool_intact(client, model, size):
    rid, resp = chat(client, model, text(size))
    assert resp.choices[0].message.content
    assert_delivered(rid, model, SENT[rid])


def test_unknown_model_raises_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        chat(client, "no-such-model", "hello")
    assert e.value.code == "model_not_found"


def test_a_wrong_key_raises_authentication_error(client):
    rid = uuid.uuid4().hex
    with pytest.raises(openai.AuthenticationError) as e:
        client.with_options(api_key="not-the-conformance-key").chat.completions.create(
            model="m1", max_tokens=4, messages=[{"role": "user", "content": "hello"}], extra_headers={ID_HEADER: rid}
        )
    assert e.value.code == "invalid_api_key"
    assert received(rid) == [], "a request with a wrong key reached an engine"


def test_router_503_is_retried_by_the_sdk(client):
    """Pool m2 fails its health checks; the router answers 503 + Retry-After; the SDK (max_retries=2) waits and
    retries; a thread restores health after 1 s; the call succeeds."""
    answered_503 = metric("infergate_router_responses_total", code="503")
    with pool_unhealthy_for("m2", 1.0):
        started = time.monotonic()
        _, resp = chat(client.with_options(max_retries=2, timeout=15), "m2", "hello")
        elapsed = time.monotonic() - started
    assert resp.choices[0].message.content
    assert metric("infergate_router_responses_total", code="503") > answered_503, "no 503 was answered"
    print(f"served after the router's 503 in {elapsed:.2f} s")


def test_a_pool_failing_every_health_check_still_serves(client):
    """Every engine of pool m1 fails its health check but serves (a check timing out under load, a wrong path):
    the pool places across them (its health panic, the default) and the SDK is answered at once, without a 503."""
    answered_503 = metric("infergate_router_responses_total", code="503")
    with pool_unhealthy_for("m1", 5.0):
        rid, resp = chat(client, "m1", "hello")
        assert metric("infergate_pool_health_panic", pool="m1") == 1
    assert resp.choices[0].message.content
    assert len(received(rid)) == 1
    assert metric("infergate_router_responses_total", code="503") == answered_503, "a 503 was answered"


def test_client_disconnect_mid_stream_releases_gauges(client):
    aborted = sim_total("m1", "aborted")
    _, stream = chat(client, "m1", text(20 * KIB), stream=True, max_tokens=20000)
    next(stream)
    assert metric("infergate_endpoint_requests_in_flight", pool="m1") >= 1
    stream.close()
    wait_for("the router's gauges at 0 (requests, prefill tokens)", lambda: gauges() == (0, 0))
    wait_for("the engine to abort the request", lambda: sim_total("m1", "aborted") > aborted)


# --- over TLS: the same router with `tls` (scripts/conformance.sh makes its CA and certificate) ----------------

TLS_URL = os.environ["INFERGATE_TLS_URL"]
TLS_CA = os.environ["INFERGATE_TLS_CA"]


@pytest.fixture(scope="module")
def tls_client():
    """An SDK client on the router's TLS port that trusts the conformance CA (and nothing else)."""
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=TLS_CA))
    with openai.OpenAI(
        base_url=f"{TLS_URL}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30, http_client=http_client
    ) as c:
        yield c


@MODELS
def test_chat_completion_over_tls(tls_client, model):
    rid, resp = chat(tls_client, model, "hello over TLS")
    assert resp.model == model
    assert resp.choices[0].message.content
    got = received(rid)
    assert len(got) == 1 and got[0][0] in POOLS[model], f"request {rid} reached {got}"
    _, stream = chat(tls_client, model, "stream over TLS", stream=True)
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)


def test_models_list_over_tls(tls_client):
    assert {"m1", "m2"} <= {m.id for m in tls_client.models.list().data}


def test_a_client_that_does_not_trust_the_router_certificate_is_refused():
    """The system's CAs do not include the conformance CA: the SDK fails to connect, nothing is sent."""
    with openai.OpenAI(base_url=f"{TLS_URL}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=10) as c:
        with pytest.raises(openai.APIConnectionError):
            c.models.list()


# --- curl tests ----------------------------------------------------------------------------------------------


def test_curl_1mib_expect_100_continue_does_not_stall(tmp_path):
    """curl waits up to 1 s for `100 Continue` before sending the body; a proxy that never answers it stalls."""
    body = chat_body("m1", text(MIB))
    rid, status, seconds, resp = curl(tmp_path, body, "Expect: 100-continue")
    print(f"1 MiB with Expect: 100-continue: {seconds:.3f} s")
    assert status == 200, resp
    assert_delivered(rid, "m1", len(body))
    assert seconds < 0.9, f"took {seconds:.3f} s: stalled waiting for 100 Continue"


@MODELS
def test_curl_chunked_upload_model_last_is_routed(tmp_path, model):
    """A 200 KiB chunked body whose `model` comes after the messages (no Expect, to keep the stall out)."""
    body = chat_body(model, text(200 * KIB), model_last=True)
    rid, status, _, resp = curl(tmp_path, body, "Transfer-Encoding: chunked", "Expect:")
    assert status == 200, resp
    assert_delivered(rid, model, len(body))


# --- a disaggregated pool (model pd): each request a prefill leg on one engine, the answer from another -----------

PD_PREFILL, PD_DECODE = os.environ["ENGINES_PD_PREFILL"], os.environ["ENGINES_PD_DECODE"]


def pd_stats():
    """GET /sim/stats of pool pd's prefill engine and of its decode engine."""
    return tuple(json.loads(http(f"{url}/sim/stats")) for url in (PD_PREFILL, PD_DECODE))


@pytest.mark.parametrize("stream", [False, True])
def test_a_disaggregated_pool_serves_the_sdk_through_both_legs(client, stream):
    (p0, d0) = pd_stats()
    raw = client.chat.completions.with_raw_response.create(
        model="pd", messages=[{"role": "user", "content": text(8 * KIB)}], max_tokens=4, stream=stream
    )
    assert raw.headers["x-infergate-prefill-endpoint"] == PD_PREFILL.removeprefix("http://")
    assert raw.headers["x-infergate-endpoint"] == PD_DECODE.removeprefix("http://")
    resp = raw.parse()
    if stream:
        chunks = [c for c in resp if c.choices]
        assert len([c for c in chunks if c.choices[0].delta.content]) == 4
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        assert resp.usage.completion_tokens == 4
        assert resp.choices[0].message.content
    (p1, d1) = pd_stats()
    # The prefill engine computed the prompt and answered one token with kv_transfer_params; the decode engine
    # pulled them and decoded the answer without computing the prompt again.
    assert p1["kv_params_issued"] - p0["kv_params_issued"] == 1
    assert p1["generation_tokens"] - p0["generation_tokens"] == 1
    assert d1["kv_pulls"] - d0["kv_pulls"] == 1
    assert d1["generation_tokens"] - d0["generation_tokens"] == 4
    assert d1["computed_prompt_tokens"] - d0["computed_prompt_tokens"] <= 1
    assert metric("infergate_disagg_prefill_legs_total", pool="pd", outcome="served") >= 1
    wait_for("the router's gauges at 0 (requests, prefill tokens)", lambda: gauges() == (0, 0))


def test_a_disaggregated_pool_refuses_what_the_protocol_cannot_carry(client):
    with pytest.raises(openai.BadRequestError, match="`n` above 1"):
        client.chat.completions.create(model="pd", messages=[{"role": "user", "content": "hi"}], max_tokens=2, n=2)

"""Conformance of infergate with the official anthropic Python SDK (whichever version this interpreter has;
scripts/conformance.sh runs the file once per pinned version) on vLLM's Anthropic front end (`/v1/messages`), as
coding agents call it: `model` after `messages`, the key in `x-api-key` (or as a bearer token, Claude Code's
ANTHROPIC_AUTH_TOKEN), `system` as cache-controlled blocks.

Covers: messages with and without streaming (anthropic-version reaches the engine, the key does not), token
counting, a four-turn session keyed by `X-Claude-Code-Session-Id` staying on one engine and reusing its prefix cache
(load_aware and predicted_ttft), a 1 MiB system prompt plus 1 MiB of conversation reaching one engine of the right
pool byte-complete, an unknown model raising anthropic.NotFoundError, a wrong key raising
anthropic.AuthenticationError with nothing reaching an engine, the router's own 503 + Retry-After retried by the SDK
until the pool is healthy again, and a client that leaves a stream after its first event (the router's gauges return
to 0 and the engine aborts).
"""

import uuid

import anthropic
import pytest

from router import (
    CLIENT_KEY,
    ID_HEADER,
    KIB,
    MIB,
    ROUTER,
    SENT,
    assert_delivered,
    gauges,
    learn_both_throughputs,
    metric,
    pool_unhealthy_for,
    received,
    record_sent,
    records,
    sim_total,
    text,
    wait_for,
)

MODELS = pytest.mark.parametrize("model", ["m1", "m2"])


@pytest.fixture(scope="module")
def client():
    """An SDK client on the router that does not retry (tests that want retries ask for them)."""
    http_client = anthropic.DefaultHttpxClient(event_hooks={"request": [record_sent]})
    with anthropic.Anthropic(
        base_url=ROUTER, api_key=CLIENT_KEY, max_retries=0, timeout=30, http_client=http_client
    ) as c:
        yield c


def message(client, model, content, **kw):
    """A tagged message through the SDK; returns (request id, response)."""
    rid = uuid.uuid4().hex
    kw.setdefault("max_tokens", 4)
    resp = client.messages.create(
        model=model, messages=[{"role": "user", "content": content}], extra_headers={ID_HEADER: rid}, **kw
    )
    return rid, resp


@MODELS
def test_message(client, model):
    rid, resp = message(client, model, "hello")
    assert resp.model == model
    assert resp.content[0].text
    assert resp.stop_reason == "max_tokens"
    assert resp.usage.output_tokens == 4
    assert_delivered(rid, model, SENT[rid])
    # Claude Code's features need anthropic-version (and anthropic-beta) forwarded unchanged; the key is not.
    headers = dict(records(rid)[0][1]["headers"])
    assert headers.get("anthropic-version") == client.default_headers["anthropic-version"]
    assert "x-api-key" not in headers, "the client's key reached the engine"


def stream_long(client, model):
    """Streams the answer to a 400 KiB prompt (teaches predicted_ttft the speed of the engine that serves it)."""
    with client.messages.stream(
        model=model, max_tokens=4, messages=[{"role": "user", "content": text(400 * KIB)}]
    ) as stream:
        for _ in stream:
            pass


@MODELS
def test_a_claude_code_session_stays_on_its_engine_and_reuses_its_cache(client, model):
    """Four turns of one conversation as Claude Code sends them (the whole history each time, its session id in
    `X-Claude-Code-Session-Id`, which the pools list after `x-session-id`, and its system prompt opened by an
    attribution block whose hash changes every request): every turn reaches the engine of the first, and every
    later turn is served mostly from that engine's prefix cache. m2 runs predicted_ttft."""
    if model == "m2":
        learn_both_throughputs(model, lambda: stream_long(client, model))
    session = uuid.uuid4().hex
    def system():
        attribution = f"x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch={uuid.uuid4().hex[:5]};"
        return [
            {"type": "text", "text": attribution},
            {"type": "text", "text": text(16 * KIB), "cache_control": {"type": "ephemeral"}},
        ]

    messages = []
    sticky = metric("infergate_placements_total", pool=model, reason="sticky")
    engines = []
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}: " + text(2 * KIB)})
        rid = uuid.uuid4().hex
        resp = client.messages.create(
            model=model,
            max_tokens=4,
            system=system(),
            messages=messages,
            extra_headers={ID_HEADER: rid, "X-Claude-Code-Session-Id": session},
        )
        messages.append({"role": "assistant", "content": resp.content[0].text})
        engines += [url for url, _ in received(rid)]
        if turn > 0:
            cached, prompt = resp.usage.cache_read_input_tokens, resp.usage.input_tokens
            assert cached > prompt / 2, f"turn {turn}: {cached} of {prompt} cached"
    assert len(engines) == 4 and len(set(engines)) == 1, f"the turns reached {engines}"
    assert metric("infergate_placements_total", pool=model, reason="sticky") == sticky + 3


@MODELS
def test_message_streaming(client, model):
    rid = uuid.uuid4().hex
    with client.messages.stream(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hello"}], extra_headers={ID_HEADER: rid}
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed and streamed == final.content[0].text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 4
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_count_tokens(client, model):
    rid = uuid.uuid4().hex
    resp = client.messages.count_tokens(
        model=model, messages=[{"role": "user", "content": text(4096)}], extra_headers={ID_HEADER: rid}
    )
    assert resp.input_tokens > 0
    assert_delivered(rid, model, SENT[rid])


@MODELS
def test_long_agent_context_reaches_its_pool_intact(client, model):
    """A coding agent's shape: a long system prompt as a cache-controlled block, then a long conversation."""
    system = [{"type": "text", "text": text(MIB), "cache_control": {"type": "ephemeral"}}]
    rid, resp = message(client, model, text(MIB), system=system)
    assert resp.content[0].text
    assert_delivered(rid, model, SENT[rid])


def test_unknown_model_raises_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        message(client, "no-such-model", "hello")
    assert e.value.body["error"]["code"] == "model_not_found"


def test_a_bearer_token_is_accepted(client):
    """Claude Code sends ANTHROPIC_AUTH_TOKEN as `Authorization: Bearer`, without `x-api-key`."""
    http_client = anthropic.DefaultHttpxClient(event_hooks={"request": [record_sent]})
    with anthropic.Anthropic(
        base_url=ROUTER, api_key=None, auth_token=CLIENT_KEY, max_retries=0, timeout=30, http_client=http_client
    ) as bearer:
        rid, resp = message(bearer, "m1", "hello")
    assert resp.content[0].text
    assert_delivered(rid, "m1", SENT[rid])


def test_a_wrong_key_raises_authentication_error(client):
    rid = uuid.uuid4().hex
    with pytest.raises(anthropic.AuthenticationError) as e:
        client.with_options(api_key="not-the-conformance-key").messages.create(
            model="m1", max_tokens=4, messages=[{"role": "user", "content": "hello"}], extra_headers={ID_HEADER: rid}
        )
    assert e.value.body["error"]["code"] == "invalid_api_key"
    assert received(rid) == [], "a request with a wrong key reached an engine"


def test_router_503_is_retried_by_the_sdk(client):
    """Pool m2 fails its health checks; the router answers 503 + Retry-After; the SDK (max_retries=2) waits and
    retries; health returns after 1 s; the call succeeds."""
    answered_503 = metric("infergate_router_responses_total", code="503")
    with pool_unhealthy_for("m2", 1.0):
        _, resp = message(client.with_options(max_retries=2, timeout=15), "m2", "hello")
    assert resp.content[0].text
    assert metric("infergate_router_responses_total", code="503") > answered_503, "no 503 was answered"


def test_client_leaving_a_stream_releases_gauges(client):
    aborted = sim_total("m1", "aborted")
    with client.messages.stream(
        model="m1", max_tokens=20000, messages=[{"role": "user", "content": text(20 * 1024)}]
    ) as stream:
        next(iter(stream))
        assert metric("infergate_endpoint_requests_in_flight", pool="m1") >= 1
    wait_for("the router's gauges at 0 (requests, prefill tokens)", lambda: gauges() == (0, 0))
    wait_for("the engine to abort the request", lambda: sim_total("m1", "aborted") > aborted)

"""Conformance of infergate with Codex CLI, OpenAI's coding agent (Apache-2.0, from npm; scripts/conformance.sh
installs the pinned release and sets CODEX_BIN): `codex exec` with the router as a custom model provider on the
Responses API (`wire_api = "responses"`), the client key as its bearer token, and the session header it sends
unasked (`session-id`).

Covers: a first turn and a resumed turn (`codex exec resume --last`) both answered, both reaching one engine of
the right pool as one session (the second placed `sticky`), with the prompt the agent built (about 40 KB of
instructions and tools) delivered byte-complete.
"""

import os
import re
import subprocess

import pytest

from router import CLIENT_KEY, LABEL, METRICS, POOLS, ROUTER, SAMPLE, http, metric, records

CODEX = os.environ["CODEX_BIN"]
MODEL = "m2"  # the pool running the shipped policy, predicted_ttft


@pytest.fixture
def codex_home(tmp_path):
    """A CODEX_HOME whose config points Codex at the router."""
    (tmp_path / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "infergate"\n'
        "[model_providers.infergate]\n"
        'name = "infergate"\n'
        f'base_url = "{ROUTER}/v1"\n'
        'env_key = "INFERGATE_KEY"\n'
        'wire_api = "responses"\n'
    )
    return tmp_path


def codex_exec(home, *args):
    """Runs `codex exec ARGS` in `home` (its CODEX_HOME and HOME); returns the finished process."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "INFERGATE_KEY": CLIENT_KEY,
    }
    cmd = [CODEX, "exec", "--skip-git-repo-check", *args]
    res = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, f"codex exited {res.returncode}:\n{res.stderr[-2000:]}"
    return res


REASONS = ("new_session", "sticky", "migrate", "rescue", "spill", "fallback")
STANDING = ("infergate_endpoint_healthy", "infergate_endpoint_speed_outlier", "infergate_endpoint_relative_speed")


def standing(pool):
    """{endpoint: {metric: value}} of `pool`'s endpoints: health and speed judgement, for a failure message."""
    out = {}
    for line in http(METRICS).splitlines():
        m = SAMPLE.match(line)
        if m and m[1] in STANDING:
            labels = dict(LABEL.findall(m[2] or ""))
            if labels.get("pool") == pool:
                out.setdefault(labels.get("endpoint"), {})[m[1].removeprefix("infergate_endpoint_")] = float(m[3])
    return out


def test_a_codex_session_stays_on_its_engine(codex_home):
    placed = {r: metric("infergate_placements_total", pool=MODEL, reason=r) for r in REASONS}
    before = standing(MODEL)
    first = codex_exec(codex_home, "say hi")
    assert "engine sim" in first.stdout, first.stdout
    session = re.search(r"session id: (\S+)", first.stderr)
    assert session, first.stderr[-2000:]
    second = codex_exec(codex_home, "resume", "--last", "and again")
    assert "engine sim" in second.stdout, second.stdout

    turns = [(url, rec) for url, rec in records(session[1], header="session-id") if rec["path"] == "/v1/responses"]
    assert len(turns) == 2, f"{len(turns)} Responses API requests of the session reached an engine"
    engines = {url for url, _ in turns}
    # On failure, say how the pool placed meanwhile (a move, and which kind, or a new session).
    reasons = {r: metric("infergate_placements_total", pool=MODEL, reason=r) - placed[r] for r in REASONS}
    assert len(engines) == 1 and engines <= set(POOLS[MODEL]), (
        f"the turns reached {engines}; placements {reasons}; the pool before the first turn {before}, "
        f"after the second {standing(MODEL)}"
    )
    assert all(rec["body_len"] > 10_000 for _, rec in turns)
    assert metric("infergate_placements_total", pool=MODEL, reason="new_session") == placed["new_session"] + 1
    assert metric("infergate_placements_total", pool=MODEL, reason="sticky") == placed["sticky"] + 1

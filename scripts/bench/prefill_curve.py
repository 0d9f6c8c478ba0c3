"""How real vLLM's prefill time grows with the context: one idle engine of the test model (the CPU build, one
compute thread, pinned to CPU 0), cold prompts of L tokens, and follow-ups of 512 new tokens on a cached context
of L; random token ids through `/v1/completions`, `max_tokens` 1, median of three. The figures behind
BENCHMARKS.md's "Real vLLM's prefill is not a line" and engine-sim's `--attention-context-tokens`.

usage (from the repository root, after scripts/ensure-vllm.sh):
  eval "$(scripts/ensure-vllm.sh)"
  python3 scripts/bench/prefill_curve.py --python "$VLLM_PYTHON" --model-dir "$VLLM_MODEL" --out DIR
Only 127.0.0.1 is used; the engine gets its own process group and is stopped at the end (about 3 minutes)."""
import argparse
import json
import os
import random
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real  # noqa: E402  (the engine command, ports and process handling of the real-vLLM bench)

COLD = [512, 1024, 2048, 4096, 8192, 12288, 16000]
CACHED = [512, 2048, 4096, 8192, 12288, 15360]
NEW = 512


def main():
    ap = argparse.ArgumentParser()
    for k in ("--python", "--model-dir", "--out"):
        ap.add_argument(k, required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(1)
    port = real.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = real.start(real.engine_cmd(a, port, core=0), f"{a.out}/engine.log", real.ENGINE_ENV)
    try:
        real.wait_up(url + "/health", 180, proc)

        def ids(n):
            return [rng.randrange(1000, 30000) for _ in range(n)]

        def seconds(prompt):
            body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                usage = json.loads(r.read())["usage"]
            return time.perf_counter() - t, usage

        seconds(ids(64))
        seconds(ids(2048))  # warm
        print("| cold prompt, tokens | seconds | ms per 1k tokens |\n|---:|---:|---:|")
        for n in COLD:
            t = sorted(seconds(ids(n))[0] for _ in range(3))[1]
            print(f"| {n} | {t:.3f} | {t / n * 1e6:.0f} |", flush=True)
        print(f"\n| follow-up: {NEW} new tokens after a cached context of | seconds | tokens vLLM reported cached |")
        print("|---:|---:|---:|")
        for n in CACHED:
            runs = []
            for _ in range(3):
                p = ids(n)
                seconds(p)
                runs.append(seconds(p + ids(NEW)))
            t, usage = sorted(runs, key=lambda r: r[0])[1]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            print(f"| {n} | {t:.3f} | {cached} |", flush=True)
    finally:
        real.stop([proc])


if __name__ == "__main__":
    main()

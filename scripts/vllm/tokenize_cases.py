"""Cases for `tokens::tests::compare_with_vllm`: a few chat and completion bodies and the token ids a real vLLM's
/tokenize gives for them (its own chat renderer: the same text and ids as /v1/chat/completions).
The model directory: a tokenizer.json and tokenizer_config.json (the real-engine suite's tiny model has both) with
tokenize_cases.jinja beside them as chat_template.jinja (a Qwen-style template: tools, tojson, namespace, strip).
Usage: python3 tokenize_cases.py [BASE_URL] > cases.jsonl, with vLLM serving that directory as "m"; then
INFERGATE_BENCH_MODEL_DIR=DIR INFERGATE_COMPARE_FILE=cases.jsonl cargo test -p infergate --release --lib \
tokens::tests::compare -- --ignored --nocapture"""
import json, sys, urllib.request

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18765"
def post(body):
    req = urllib.request.Request(BASE + "/tokenize", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))
bodies = [
 ("chat", {"model":"m","messages":[{"role":"system","content":"  Be brief.  "},{"role":"user","content":"Hello, wörld! What's 2+2?"},{"role":"assistant","content":"4."},{"role":"user","content":[{"type":"text","text":"And"},{"type":"text","text":"3+3?"}]}]}),
 ("chat", {"model":"m","messages":[{"role":"user","content":"weather in Paris?"},{"role":"assistant","content":None,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"21 C"}],
   "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather <now> & later","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}),
 ("chat", {"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"id":"c2","type":"function","function":{"name":"f","arguments":""}}]},{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
   "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}),
 ("completions", {"model":"m","prompt":"Once upon a time, in a land far away"}),
]
for api, b in bodies:
    ids = post(b)["tokens"]
    print(json.dumps({"api": api, "body": json.dumps(b), "ids": ids}))

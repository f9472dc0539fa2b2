"""The demo run twice on one store with its reads cached (BENCHMARKS.md, "The demo run twice on
one store"): whole processes of the release binary, each pair on a new store, then a third run
with --no-cache on the same store. Usage: python3 scripts/bench/cache_twice.py [PAIRS]"""
import subprocess, time, tempfile, os, json, statistics, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
BIN = "target/release/toolscript"
variants = {
    "with invalidates": "scripts/bench/demo_cached.toml",
    "reads only": os.path.join(tempfile.gettempdir(), "demo_reads_only.toml"),
}
src = open("scripts/bench/demo_cached.toml").read()
open(os.path.join(tempfile.gettempdir(), "demo_reads_only.toml"), "w").write("\n".join(l for l in src.split("\n") if not l.startswith("invalidates")))
def run(tools, store, *extra):
    t = time.perf_counter()
    out = subprocess.run([BIN, "run", "scripts/demo.rhai", "--tools", tools, "--store", store, "--json", *extra], capture_output=True, text=True)
    wall = time.perf_counter() - t
    d = json.loads(out.stdout)
    return wall * 1e3, d["stats"]["cache_hits"], d["stats"]["dispatched"], json.dumps(d["value"], sort_keys=True)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
for name, tools in variants.items():
    first, second, nocache, hits, values = [], [], [], set(), set()
    for i in range(N):
        with tempfile.TemporaryDirectory() as d:
            store = os.path.join(d, "s.sqlite3")
            a = run(tools, store); b = run(tools, store); c = run(tools, store, "--no-cache")
            first.append(a[0]); second.append(b[0]); nocache.append(c[0])
            hits.add((a[1], b[1], c[1])); values.add(a[3]); values.add(b[3]); values.add(c[3])
    med = statistics.median
    print(f"{name}: first {med(first):.0f} ms ({min(first):.0f}-{max(first):.0f}), second {med(second):.0f} ms ({min(second):.0f}-{max(second):.0f}), --no-cache {med(nocache):.0f} ms ({min(nocache):.0f}-{max(nocache):.0f}); ratio second/first {med([s/f for s,f in zip(second, first)]):.3f}; hits (first, second, no-cache) {sorted(hits)}; same value {len(values)==1}")

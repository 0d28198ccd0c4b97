"""The transformers server's HTTP, batching, dump writing and refusals, with a tiny torch
module (tinymodel.py) in place of the model. This is NOT transformers: CI has torch but
no transformers; the device script (scripts/device_transformers.sh) runs a real one.

Run from this folder: python3 -m unittest (needs torch; skips without it).
"""

import concurrent.futures
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = os.path.join(os.path.dirname(HERE), "hook")

try:
    import torch
except ImportError:
    torch = None

sys.path[:0] = [HERE, HOOK]
from extract_hfserver import batching, server  # noqa: E402  (pure Python without torch)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_dump(path):
    """Header and tensor bytes of a safetensors file, parsed by hand."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    tensors = {k: data[v["data_offsets"][0] : v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
    return header, tensors


def bf16_bytes(rows):
    return torch.tensor(rows, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy().tobytes()


class PlanBatchTest(unittest.TestCase):
    def test_a_batch_takes_requests_while_the_padded_tokens_fit_the_budget(self):
        import collections

        reqs = [server.Request(f"s{i:09d}-a1", [1] * n) for i, n in enumerate([4, 3, 5, 2, 9])]
        pending = collections.deque(reqs[1:])
        batch = batching.plan_batch(pending, reqs[0], max_tokens=15, max_requests=10)
        # 4,3 -> 2x4=8; +5 -> 3x5=15; +2 -> 4x5=20 > 15
        self.assertEqual([len(r.ids) for r in batch], [4, 3, 5])
        self.assertEqual([len(r.ids) for r in pending], [2, 9])

    def test_a_prompt_longer_than_the_budget_runs_alone(self):
        import collections

        big = server.Request("s000000000-a1", [1] * 100)
        pending = collections.deque([server.Request("s000000001-a1", [1])])
        self.assertEqual(batching.plan_batch(pending, big, max_tokens=10, max_requests=10), [big])
        self.assertEqual(len(pending), 1)

    def test_the_request_cap_holds_however_short_the_prompts(self):
        import collections

        reqs = [server.Request(f"s{i:09d}-a1", [1]) for i in range(5)]
        pending = collections.deque(reqs[1:])
        self.assertEqual(len(batching.plan_batch(pending, reqs[0], max_tokens=1000, max_requests=3)), 3)

    def test_layer_ids_must_have_a_decoder_layer_to_be_captured_at(self):
        server.check_layers((1, 2, 3), 4)
        for bad in ((0, 1, 2), (1, 2, 4)):
            with self.assertRaises(ValueError):
                server.check_layers(bad, 4)


@unittest.skipIf(torch is None, "torch is not importable here (install python3-torch)")
class ServerTest(unittest.TestCase):
    LAYERS = (1, 2, 3)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shm = os.path.join(cls.tmp.name, "shm")
        os.mkdir(cls.shm)
        cls.gate = os.path.join(cls.tmp.name, "gate")
        cls.port = free_port()
        cls.proc = cls.start(cls.port, cls.LAYERS, delay="0.2")
        cls.base = f"http://127.0.0.1:{cls.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if cls.get("/health_generate")[0] == 200:
                    break
            except OSError:
                pass
            if cls.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {cls.proc.stdout.read()}")
            time.sleep(0.1)

    @classmethod
    def start(cls, port, layers, delay="0", extra=(), dtype="bfloat16"):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, HOOK]), HFSERVER_BACKEND="tinymodel:load", TINY_DELAY=delay,
                   TINY_GATE=cls.gate, TINY_DTYPE=dtype)
        argv = [sys.executable, "-m", "extract_hfserver", "--model-path", "/models/tiny", "--port", str(port),
                "--shm-dir", cls.shm, "--layers", ",".join(map(str, layers)),
                "--max-batch-tokens", "64", "--max-batch-requests", "8", "--batch-wait", "0.05", *extra]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @classmethod
    def tearDownClass(cls):
        cls.proc.kill()
        cls.proc.wait()
        cls.proc.stdout.close()
        cls.tmp.cleanup()

    @classmethod
    def get(cls, path):
        try:
            with urllib.request.urlopen(cls.base + path, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def post(self, body):
        req = urllib.request.Request(self.base + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def test_server_info_says_capture_is_whole_as_check_capture_reads_it(self):
        for path in ("/server_info", "/get_server_info"):
            status, info = self.get(path)
            self.assertEqual(status, 200)
            self.assertEqual(info["model_path"], "/models/tiny")
            self.assertEqual(info["tp_size"], 1)
            self.assertTrue(info["disable_radix_cache"])
            self.assertEqual(info["chunked_prefill_size"], -1)
            self.assertFalse(info["enable_two_batch_overlap"])
            self.assertEqual(info["layers"], "1,2,3")
        status, mi = self.get("/model_info")
        self.assertEqual((status, mi["num_layers"], mi["hidden_size"]), (200, 4, 16))

    def test_the_marker_names_this_server_pid_and_its_layers(self):
        with open(os.path.join(self.shm, f".hook-{self.proc.pid}.json")) as f:
            marker = json.load(f)
        self.assertEqual((marker["pid"], marker["protocol"], marker["layers"], marker["model"]),
                         (self.proc.pid, "1", "1,2,3", "/models/tiny"))

    def test_connections_queue_while_the_server_cannot_accept(self):
        # A stopped server accepts nothing: the kernel completes as many handshakes as the
        # listen backlog holds (socketserver's default: 5) and leaves the rest waiting.
        os.kill(self.proc.pid, signal.SIGSTOP)
        socks = []
        try:
            for _ in range(64):
                s = socket.socket()
                s.settimeout(0.5)
                socks.append(s)
                s.connect(("127.0.0.1", self.port))
        except OSError as e:
            self.fail(f"connection {len(socks)} of 64 not queued while the server was stopped: {e}")
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)
            for s in socks:
                s.close()
        self.assertEqual(self.get("/health")[0], 200)

    def test_concurrent_requests_are_batched_and_each_dump_is_exact(self):
        import tinymodel

        before = self.get("/server_info")[1]["stats"]
        prompts = {f"s{100 + i:09d}-a1": [(7 * i + p) % 1000 for p in range(3 + (i * 5) % 13)] for i in range(24)}
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda kv: self.post({"rid": kv[0], "input_ids": kv[1], "sampling_params": {"max_new_tokens": 1}}), prompts.items()))
        for (rid, ids), (status, body) in zip(prompts.items(), answers):
            self.assertEqual(status, 200, body)
            self.assertEqual((body["meta_info"]["id"], body["meta_info"]["prompt_tokens"]), (rid, len(ids)))
            # The answer comes after the rename: the dump is there already.
            header, t = read_dump(os.path.join(self.shm, rid + ".safetensors"))
            meta = header["__metadata__"]
            self.assertEqual((meta["rid"], meta["protocol"], meta["layers"], meta["model"]), (rid, "1", "1,2,3", "/models/tiny"))
            self.assertEqual(header["aux_hidden_state"]["shape"], [len(ids), 48])
            aux, final = tinymodel.expected(ids, self.LAYERS)
            self.assertEqual(t["aux_hidden_state"], bf16_bytes(aux), rid)
            self.assertEqual(t["hidden_state"], bf16_bytes(final), rid)
            self.assertEqual(t["input_ids"], struct.pack(f"<{len(ids)}q", *ids))
        after = self.get("/server_info")[1]["stats"]
        batches = after["batches"] - before["batches"]
        self.assertLess(batches, len(prompts), "24 concurrent requests never shared a forward")
        self.assertLessEqual(after["max_batch_requests_seen"], 8)
        self.assertFalse([n for n in os.listdir(self.shm) if n.endswith(".partial")])

    def hold_forwards(self):
        """Holds every forward until the returned function is called."""
        open(self.gate, "w").close()
        self.addCleanup(lambda: os.path.exists(self.gate) and os.unlink(self.gate))
        return lambda: os.unlink(self.gate)

    def wait_serving(self, n):
        deadline = time.monotonic() + 60
        while self.get("/server_info")[1]["serving"] < n:
            self.assertLess(time.monotonic(), deadline, f"never {n} requests being served")
            time.sleep(0.01)

    def test_a_probe_runs_before_the_requests_queued_ahead_of_it(self):
        # Behind a full sort window a probe would outwait the orchestrator's health and
        # adoption timeouts on a slow model; it goes before the worker's next batch.
        prompts = {f"s{800 + i:09d}-a1": [(3 * i + p) % 1000 for p in range(4)] for i in range(40)}
        answered = {}

        def post(rid, ids):
            status, _ = self.post({"rid": rid, "input_ids": ids})
            answered[rid] = time.monotonic()
            return status

        def probe():
            status, _ = self.get("/health_generate")
            return status, time.monotonic()

        release = self.hold_forwards()
        with concurrent.futures.ThreadPoolExecutor(len(prompts) + 1) as pool:
            posts = [pool.submit(post, rid, ids) for rid, ids in prompts.items()]
            self.wait_serving(len(prompts))
            probed = pool.submit(probe)
            time.sleep(0.2)  # the probe reaches the server while the first batch is held
            release()
            status, at = probed.result()
            self.assertEqual([f.result() for f in posts], [200] * len(prompts))
        self.assertEqual(status, 200)
        first = sorted(rid for rid, t in answered.items() if t < at)
        # Batches of 8 here: the one held when the probe came, and at most one more.
        self.assertLessEqual(len(first), 16, f"{len(first)} of {len(prompts)} requests queued before the probe were answered before it")

    def test_a_retried_rid_joins_the_request_in_flight_and_is_computed_once(self):
        import tinymodel

        rid, ids = "s000000700-a1", [5, 6, 7, 8, 9]
        before = self.get("/server_info")[1]["stats"]["requests"]
        release = self.hold_forwards()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(self.post, {"rid": rid, "input_ids": ids})
            self.wait_serving(1)
            retries = [pool.submit(self.post, {"rid": rid, "input_ids": ids}) for _ in range(3)]
            time.sleep(0.2)  # let the retries reach the server: a late one is only a new request
            release()
            answers = [f.result() for f in [first, *retries]]
        self.assertEqual([a[0] for a in answers], [200] * 4, answers)
        self.assertEqual(self.get("/server_info")[1]["stats"]["requests"] - before, 1, "the rid was computed more than once")
        _, t = read_dump(os.path.join(self.shm, rid + ".safetensors"))
        aux, final = tinymodel.expected(ids, self.LAYERS)
        self.assertEqual((t["aux_hidden_state"], t["hidden_state"]), (bf16_bytes(aux), bf16_bytes(final)))
        self.assertFalse([n for n in os.listdir(self.shm) if n.endswith(".partial")])

    def test_a_rid_in_flight_with_other_input_ids_is_a_conflict(self):
        rid = "s000000701-a1"
        release = self.hold_forwards()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(self.post, {"rid": rid, "input_ids": [1, 2, 3]})
            self.wait_serving(1)
            status, answer = self.post({"rid": rid, "input_ids": [1, 2, 4]})
            release()
            self.assertEqual(first.result()[0], 200)
        self.assertEqual(status, 409, answer)
        self.assertIn("other input ids", answer["error"]["message"])
        _, t = read_dump(os.path.join(self.shm, rid + ".safetensors"))
        self.assertEqual(t["input_ids"], struct.pack("<3q", 1, 2, 3))

    def test_a_partial_someone_else_holds_is_a_conflict_and_stays(self):
        rid = "s000000702-a1"
        partial = os.path.join(self.shm, rid + ".safetensors.partial")
        with open(partial, "wb") as f:
            f.write(b"another writer's bytes")
        status, answer = self.post({"rid": rid, "input_ids": [1, 2, 3]})
        self.assertEqual(status, 409, answer)
        with open(partial, "rb") as f:
            self.assertEqual(f.read(), b"another writer's bytes")
        self.assertFalse(os.path.exists(os.path.join(self.shm, rid + ".safetensors")))
        os.unlink(partial)

    def test_bad_requests_are_refused_with_400_and_no_dump(self):
        for body in (
            {"rid": "not-a-rid", "input_ids": [1]},
            {"rid": "s000000900-a1", "input_ids": []},
            {"rid": "s000000901-a1", "input_ids": [1, -2]},
            {"rid": "s000000902-a1", "input_ids": [1, 2.5]},
            {"rid": "s000000905-a1", "input_ids": [1, True]},  # JSON true is no token id
            {"rid": "s000000903-a1", "text": "hello"},  # the tiny module has no tokenizer
            {"rid": "s000000904-a1"},
        ):
            status, answer = self.post(body)
            self.assertEqual(status, 400, body)
            self.assertTrue(answer["error"]["message"])
        self.assertFalse([n for n in os.listdir(self.shm) if n.startswith("s00000090")])

    def test_a_float32_model_dumps_its_states_as_bfloat16(self):
        # The device buffers are bfloat16 (the dump's dtype); a model loaded in float32
        # once failed its warm-up forward on the final state's gather (index_select out=).
        import tinymodel

        port = free_port()
        proc = self.start(port, self.LAYERS, dtype="float32")
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(base + "/health_generate", timeout=30) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.fail(f"float32 server did not start: {proc.stdout.read()}")
                time.sleep(0.1)
            rid, ids = "s000000555-a1", [5, 17, 250, 3, 9]
            req = urllib.request.Request(base + "/generate", data=json.dumps({"rid": rid, "input_ids": ids, "sampling_params": {"max_new_tokens": 1}}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                self.assertEqual(r.status, 200)
            header, t = read_dump(os.path.join(self.shm, rid + ".safetensors"))
            self.assertEqual(header["hidden_state"]["dtype"], "BF16")
            aux, final = tinymodel.expected(ids, self.LAYERS)
            self.assertEqual(t["aux_hidden_state"], bf16_bytes(aux))
            self.assertEqual(t["hidden_state"], bf16_bytes(final))
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()

    def test_layers_beyond_the_model_are_refused_at_start_with_exit_3(self):
        proc = self.start(free_port(), (1, 2, 4))
        out, _ = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 3, out)
        self.assertIn("extract-hook: FATAL: layers 1,2,4", out)


if __name__ == "__main__":
    unittest.main()

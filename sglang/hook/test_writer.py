"""Tests of the hook's pure-Python parts: the dump writer, the batch planning and the
writer threads' bookkeeping.

Runs with plain `python3 -m unittest` in this folder: no torch, numpy or pytest.
"""

import array
import json
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import unittest

from extract_hook import HOOK_VERSION, PROTOCOL, capture, writer

RID = "s000018421-a2"
LAYERS = (2, 30, 58)


def pattern(n, seed):
    """n distinct-looking bytes, so a swapped or shifted tensor cannot compare equal."""
    return bytes((i * 31 + seed * 7 + (i >> 8)) % 251 for i in range(n))


def read_dump(path):
    """Parses a safetensors file by the format's rules, independently of the writer."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    raw = data[8 : 8 + n]
    header = json.loads(raw)
    body = data[8 + n :]
    return n, raw, header, body


class WriteDumpTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hook-writer-")
        self.addCleanup(shutil.rmtree, self.dir)

    def write(self, tokens=5, hidden_size=8, rid=RID, **overrides):
        args = dict(
            aux=pattern(tokens * 3 * hidden_size * 2, 1),
            hidden=pattern(tokens * hidden_size * 2, 2),
            input_ids=struct.pack(f"<{tokens}q", *[163839 - 1000 * i for i in range(tokens)]),
            tokens=tokens,
            hidden_size=hidden_size,
            layers=LAYERS,
            model="/models/Kimi-K2.5",
        )
        args.update(overrides)
        path = writer.write_dump(self.dir, rid, **args)
        return path, args

    def test_round_trip_byte_for_byte(self):
        path, args = self.write()
        self.assertEqual(path, os.path.join(self.dir, RID + ".safetensors"))
        self.assertEqual(os.listdir(self.dir), [RID + ".safetensors"], "no .partial may remain")

        n, raw, header, body = read_dump(path)
        self.assertEqual(n % 8, 0, "data section must start 8-aligned")
        json_text = raw.rstrip(b" ")
        self.assertTrue(json_text.endswith(b"}"), "only spaces may pad the header")
        self.assertLess(len(raw) - len(json_text), 8, "no more padding than alignment needs")
        self.assertEqual(
            header["__metadata__"],
            {
                "rid": RID,
                "protocol": "1",
                "layers": "2,30,58",
                "model": "/models/Kimi-K2.5",
                "hook_version": HOOK_VERSION,
            },
        )
        expected = [
            ("aux_hidden_state", "BF16", [5, 24], args["aux"]),
            ("hidden_state", "BF16", [5, 8], args["hidden"]),
            ("input_ids", "I64", [5], args["input_ids"]),
        ]
        self.assertEqual(set(header), {"__metadata__"} | {name for name, *_ in expected})
        at = 0
        for name, dtype, shape, content in expected:
            t = header[name]
            self.assertEqual(t["dtype"], dtype, name)
            self.assertEqual(t["shape"], shape, name)
            self.assertEqual(t["data_offsets"], [at, at + len(content)], name)
            self.assertEqual(body[at : at + len(content)], content, name)
            at += len(content)
        self.assertEqual(len(body), at, "no bytes after the last tensor")
        ids = struct.unpack("<5q", body[at - 40 :])
        self.assertEqual(ids, (163839, 162839, 161839, 160839, 159839))

    def test_accepts_any_contiguous_buffer(self):
        hidden = bytearray(pattern(2 * 4 * 2, 3))
        ids = array.array("q", [7, 8])
        if sys.byteorder != "little":
            ids.byteswap()
        path, _ = self.write(
            tokens=2,
            hidden_size=4,
            aux=memoryview(pattern(2 * 12 * 2, 4)),
            hidden=hidden,
            input_ids=ids,
        )
        _, _, header, body = read_dump(path)
        start, end = header["hidden_state"]["data_offsets"]
        self.assertEqual(body[start:end], bytes(hidden))
        start, end = header["input_ids"]["data_offsets"]
        self.assertEqual(struct.unpack("<2q", body[start:end]), (7, 8))

    def test_rewrite_replaces_the_file(self):
        self.write()
        path, _ = self.write(tokens=1)
        _, _, header, _ = read_dump(path)
        self.assertEqual(header["input_ids"]["shape"], [1])
        self.assertEqual(os.listdir(self.dir), [RID + ".safetensors"])

    def test_size_mismatches_are_errors_and_write_nothing(self):
        cases = {
            "aux_hidden_state": dict(aux=pattern(5 * 24 * 2 - 2, 1)),
            "hidden_state": dict(hidden=pattern(5 * 8 * 2 + 2, 2)),
            "input_ids": dict(input_ids=struct.pack("<4q", 1, 2, 3, 4)),
        }
        for name, override in cases.items():
            with self.subTest(name):
                with self.assertRaisesRegex(ValueError, name):
                    self.write(**override)
                self.assertEqual(os.listdir(self.dir), [])

    def test_bad_arguments_are_errors_and_write_nothing(self):
        cases = [
            ("tokens", dict(tokens=0, aux=b"", hidden=b"", input_ids=b"")),
            ("hidden size", dict(hidden_size=0)),
            ("protocol v1 rid", dict(rid="../s000018421-a2")),
            ("protocol v1 rid", dict(rid="s18421-a2")),
            ("protocol v1 rid", dict(rid="s000018421-a0")),
            ("exactly 3", dict(layers=(2, 30))),
            ("ascending", dict(layers=(30, 2, 58))),
            (">= 1", dict(layers=(0, 30, 58))),
        ]
        for want, override in cases:
            with self.subTest(override):
                with self.assertRaisesRegex(ValueError, want):
                    self.write(**override)
                self.assertEqual(os.listdir(self.dir), [])

    def test_non_buffer_is_a_type_error(self):
        with self.assertRaisesRegex(TypeError, "hidden_state"):
            self.write(hidden=[0] * 80)

    def test_failed_publish_removes_the_partial(self):
        # A directory squatting on the final name makes the rename fail after the
        # partial file is complete.
        os.mkdir(os.path.join(self.dir, RID + ".safetensors"))
        with self.assertRaises(OSError):
            self.write()
        self.assertEqual(os.listdir(self.dir), [RID + ".safetensors"])
        self.assertTrue(os.path.isdir(os.path.join(self.dir, RID + ".safetensors")))

    def test_a_symlink_planted_under_the_partial_name_is_not_followed(self):
        victim = os.path.join(self.dir, "victim")
        with open(victim, "wb") as f:
            f.write(b"not yours")
        partial = os.path.join(self.dir, RID + ".safetensors.partial")
        os.symlink(victim, partial)
        with self.assertRaises(writer.DumpInProgress):
            self.write()
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"not yours")
        self.assertTrue(os.path.islink(partial), "the planted name is not ours to remove")
        self.assertFalse(os.path.exists(os.path.join(self.dir, RID + ".safetensors")))

    def test_a_partial_being_written_is_neither_truncated_nor_removed(self):
        # Another writer of this rid holds the partial name (a retried request, or a
        # second server on the same staging dir): its bytes stay exactly as they are.
        partial = os.path.join(self.dir, RID + ".safetensors.partial")
        with open(partial, "wb") as f:
            f.write(b"another writer's bytes")
        with self.assertRaises(writer.DumpInProgress) as caught:
            self.write()
        self.assertIsInstance(caught.exception, FileExistsError)
        with open(partial, "rb") as f:
            self.assertEqual(f.read(), b"another writer's bytes")
        self.assertEqual(os.listdir(self.dir), [RID + ".safetensors.partial"])

    def test_concurrent_writers_of_one_rid_never_leave_a_mixed_dump(self):
        # Two threads write the same rid with different bytes at the same moment, many
        # times over. Whatever the interleaving, the dump that appears is one writer's,
        # whole; the other writer is told the rid is being written.
        tokens, hidden = 64, 1024  # 512 KiB a dump: writes long enough to overlap
        mixed = 0
        for round_ in range(30):
            barrier = threading.Barrier(2)
            results, wants = {}, {}

            def run(seed):
                args = dict(aux=bytes([seed]) * (tokens * 3 * hidden * 2), hidden=bytes([seed + 1]) * (tokens * hidden * 2))
                wants[seed] = args
                barrier.wait()
                try:
                    self.write(tokens=tokens, hidden_size=hidden, **args)
                    results[seed] = "written"
                except writer.DumpInProgress:
                    results[seed] = "in progress"

            threads = [threading.Thread(target=run, args=(seed,)) for seed in (10, 20)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertIn("written", results.values(), f"round {round_}: {results}")
            _, _, header, body = read_dump(os.path.join(self.dir, RID + ".safetensors"))
            a0, a1 = header["aux_hidden_state"]["data_offsets"]
            h0, h1 = header["hidden_state"]["data_offsets"]
            whole = [s for s, w in wants.items() if body[a0:a1] == w["aux"] and body[h0:h1] == w["hidden"]]
            mixed += not whole
            self.assertEqual(os.listdir(self.dir), [RID + ".safetensors"], f"round {round_}")
        self.assertEqual(mixed, 0, "dumps with bytes of both writers")

    def test_missing_directory_leaves_nothing(self):
        with self.assertRaises(FileNotFoundError):
            writer.write_dump(
                os.path.join(self.dir, "gone"),
                RID,
                aux=bytes(48),
                hidden=bytes(16),
                input_ids=bytes(8),
                tokens=1,
                hidden_size=8,
                layers=LAYERS,
                model="m",
            )
        self.assertEqual(os.listdir(self.dir), [])


class LayersTest(unittest.TestCase):
    def test_parse_and_format(self):
        self.assertEqual(writer.parse_layers("2,30,58"), (2, 30, 58))
        self.assertEqual(writer.parse_layers(" 2, 30 ,58"), (2, 30, 58))
        self.assertEqual(writer.format_layers([2, 30, 58]), "2,30,58")

    def test_parse_rejects(self):
        for text in ("", "2,30", "2,30,58,60", "a,b,c", "2,2,58", "0,30,58", "-1,30,58"):
            with self.subTest(text):
                with self.assertRaises(ValueError):
                    writer.parse_layers(text)


class MarkerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hook-marker-")
        self.addCleanup(shutil.rmtree, self.dir)

    def test_marker_content_and_name(self):
        path = writer.write_marker(self.dir, 4242, {"sglang_version": "0.5.8", "layers": "2,30,58"})
        name = os.path.basename(path)
        # Dumps are <rid>.safetensors; the orchestrator ignores anything else.
        self.assertEqual(name, ".hook-4242.json")
        with open(path) as f:
            content = json.load(f)
        self.assertEqual(
            content,
            {
                "hook_version": HOOK_VERSION,
                "protocol": PROTOCOL,
                "pid": 4242,
                "sglang_version": "0.5.8",
                "layers": "2,30,58",
            },
        )
        self.assertEqual(os.listdir(self.dir), [name])

    def test_a_symlink_under_the_old_marker_temp_name_is_not_followed(self):
        victim = os.path.join(self.dir, "victim")
        with open(victim, "w") as f:
            f.write("not yours")
        planted = writer.marker_path(self.dir, 4242) + ".partial"
        os.symlink(victim, planted)
        writer.write_marker(self.dir, 4242, {"layers": "2,30,58"})
        with open(victim) as f:
            self.assertEqual(f.read(), "not yours")
        self.assertTrue(os.path.islink(planted))
        with open(writer.marker_path(self.dir, 4242)) as f:
            self.assertEqual(json.load(f)["pid"], 4242)

    def test_stale_markers_are_removed(self):
        # A child that has exited and been reaped is a pid that no longer exists.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        dead = writer.write_marker(self.dir, pid, {})
        live = writer.write_marker(self.dir, os.getpid(), {})
        other = os.path.join(self.dir, "s000000001-a1.safetensors")
        open(other, "wb").close()
        self.assertEqual(writer.remove_stale_markers(self.dir), [dead])
        self.assertEqual(sorted(os.listdir(self.dir)), sorted([os.path.basename(live), os.path.basename(other)]))


class PlanRequestsTest(unittest.TestCase):
    def test_rows_follow_extend_lengths(self):
        jobs, skipped = capture.plan_requests(
            [("s000000001-a1", 3), ("s000000002-a1", 1), ("s000000003-a4", 5)],
            [3, 1, 5],
            [0, 0, 0],
            9,
        )
        self.assertEqual(
            jobs,
            [
                capture.Job("s000000001-a1", 0, 3),
                capture.Job("s000000002-a1", 3, 4),
                capture.Job("s000000003-a4", 4, 9),
            ],
        )
        self.assertEqual(skipped, [])

    def test_skips_keep_the_other_rows_in_place(self):
        jobs, skipped = capture.plan_requests(
            [
                ("9f1c2d0e6a7b4c3d8e9f0a1b2c3d4e5f", 6),  # SGLang's own warm-up request
                ("s000000001-a1", 10),  # 4 tokens from a prefix cache
                ("s000000002-a1", 8),  # a chunk, not the whole prompt
                ("s000000003-a1", 2),
            ],
            [6, 6, 4, 2],
            [0, 4, 0, 0],
            18,
        )
        self.assertEqual(jobs, [capture.Job("s000000003-a1", 16, 18)])
        self.assertEqual([(rid, is_error) for rid, _, is_error in skipped], [
            ("9f1c2d0e6a7b4c3d8e9f0a1b2c3d4e5f", False),
            ("s000000001-a1", True),
            ("s000000002-a1", True),
        ])

    def test_inconsistent_batches_are_errors(self):
        with self.assertRaisesRegex(ValueError, "rows"):
            capture.plan_requests([("s000000001-a1", 3)], [3], [0], 4)
        with self.assertRaisesRegex(ValueError, "requests"):
            capture.plan_requests([("s000000001-a1", 3)], [3, 1], [0, 0], 4)


class BackgroundTest(unittest.TestCase):
    """The writer threads' bookkeeping, with plain functions in place of dump writes."""

    def setUp(self):
        self.bg = capture._Background()
        self.addCleanup(self.bg.drain, 0)

    def test_one_rid_is_written_by_one_thread_at_a_time(self):
        events = []

        def job(name, pause):
            def run():
                events.append(("start", name))
                time.sleep(pause)
                events.append(("end", name))

            return run

        self.bg.submit([("s000000001-a1", job("first", 0.2)), ("s000000002-a1", job("other", 0))])
        self.bg.submit([("s000000001-a1", job("second", 0))])
        self.bg.drain(0)
        self.assertLess(events.index(("end", "first")), events.index(("start", "second")))
        self.assertEqual(self.bg._latest, {})

    def test_a_bug_in_a_writer_thread_is_raised_in_the_caller(self):
        def bug():
            raise ValueError("sizes disagree")

        self.bg.submit([("s000000001-a1", bug)])
        with self.assertRaisesRegex(ValueError, "sizes disagree"):
            self.bg.drain(0)

    def test_a_third_batch_waits_for_room(self):
        release = threading.Event()
        self.bg.submit([("s000000001-a1", release.wait)])
        self.bg.submit([("s000000002-a1", lambda: None)])
        third = threading.Thread(target=self.bg.wait_for_room)
        third.start()
        third.join(0.2)
        self.assertTrue(third.is_alive(), "room for a third batch must wait for the first")
        release.set()
        third.join(5)
        self.assertFalse(third.is_alive())


if __name__ == "__main__":
    unittest.main()

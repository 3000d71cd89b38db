"""Writes numbered 4 KiB records into a file and says which ones were acknowledged.

  acked_writer.py write FILE ACKS MODE   # MODE: direct (O_DIRECT, a write returning
                                         # acknowledges it) or fsync (buffered writes, every
                                         # FSYNC_EVERY-th followed by fsync, which acknowledges
                                         # all before it)
  acked_writer.py check FILE ACKS MODE   # every acknowledged record reads back exactly

Record number `seq` goes to slot seq % SLOTS, so slots are overwritten again and again, and
its bytes are a function of seq alone; a writer started again goes on from the count in
ACKS. After each acknowledgement the writer overwrites ACKS
(a local file) with the count of acknowledged records, so when it is killed, ACKS says how
many were acknowledged. The check then requires, per slot, the newest acknowledged record,
or for the slots of the few records written after the last acknowledgement (at most one
write, or one fsync interval, in flight) either that or the record they may have replaced.
"""
import mmap
import os
import random
import sys

SLOTS = 512
PAGE = 4096
FSYNC_EVERY = 16


def record(seq):
    return seq.to_bytes(8, "little") + random.Random(seq).randbytes(PAGE - 8)


def window(mode):
    return 1 if mode == "direct" else FSYNC_EVERY


def write(path, acks, mode):
    flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if mode == "direct" else 0)
    fd = os.open(path, flags, 0o644)
    # A writer started again goes on from the records already acknowledged.
    seq = int(open(acks).read()) if os.path.exists(acks) else 0
    ack = os.open(acks, os.O_WRONLY | os.O_CREAT, 0o644)
    buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT needs
    while True:
        buf[:] = record(seq)
        if os.pwrite(fd, buf, (seq % SLOTS) * PAGE) != PAGE:
            sys.exit(f"short write of record {seq}")
        seq += 1
        if mode == "fsync" and seq % FSYNC_EVERY:
            continue
        if mode == "fsync":
            os.fsync(fd)
        os.pwrite(ack, b"%12d\n" % seq, 0)


def check(path, acks, mode):
    acked = int(open(acks).read())
    data = open(path, "rb").read()
    unsure = range(acked, acked + window(mode))
    for slot in range(min(SLOTS, acked + window(mode))):
        # The newest acknowledged record of this slot, if any.
        newest = None
        if slot < acked:
            newest = acked - 1 - (acked - 1 - slot) % SLOTS
        allowed = [] if newest is None else [record(newest)]
        allowed += [record(s) for s in unsure if s % SLOTS == slot]
        got = data[slot * PAGE:(slot + 1) * PAGE]
        if newest is None and got in (b"", bytes(PAGE)):
            continue
        if got not in allowed:
            seq = int.from_bytes(got[:8], "little") if len(got) == PAGE else None
            sys.exit(f"slot {slot}: want record {newest} (of {acked} acknowledged), "
                     f"got {len(got)} bytes starting with record number {seq}")
    print(f"{acked} acknowledged records ({mode}) read back exactly")


if __name__ == "__main__":
    cmd, path, acks, mode = sys.argv[1:5]
    assert mode in ("direct", "fsync"), mode
    {"write": write, "check": check}[cmd](path, acks, mode)

"""Reads TensorBoard event files with the tensorboard package (an oracle for the tests: the event
files loongforge-train writes must be what TensorBoard itself loads). Prints every scalar as JSON:
{tag: [[step, value], ...]}.  Usage: tensorboard_oracle.py EVENT_DIR"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""Drives loongforge-serve-policy with the real OpenPI client (openpi_client.WebsocketClientPolicy).

Run with the openpi-client venv (tools/install-deps): python openpi_client_check.py HOST PORT MODE
  expert CHUNK: metadata, an action chunk for a known scene (the first actions towards the named
         block), timings, nested observations, malformed requests answered with an error text and a
         1011 close while the server keeps serving.
  random CHUNK: metadata and the chunk's ranges.
  pi05_lerobot CHUNK: a pi05 trained on a LeRobot dataset; the cameras the metadata names are sent
         as a LIBERO client names them (observation/<last part of the key>, [H, W, 3] uint8 of
         pattern_image), the state as observation/state; prints the chunk (ACTIONS ...) and the
         error for a missing camera.
Prints "OK" at the end; any failure raises (non-zero exit).
"""

import sys
import types

try:
    import typing_extensions  # noqa: F401  (openpi_client imports it without requiring it)
except ImportError:
    sys.modules["typing_extensions"] = types.SimpleNamespace(override=lambda f: f)

import msgpack
import numpy as np
from openpi_client import msgpack_numpy
from openpi_client import websocket_client_policy
import websockets.sync.client


def scene(prompt="put the red block on the blue target"):
    # The red block up-left of the gripper, the blue target down-right (reach_env.h's observation).
    return {
        "observation/image": np.zeros((64, 64, 3), np.uint8),
        "observation/state": np.array([0.5, 0.5, 0.0], np.float32),
        "prompt": prompt,
        "env/blocks": np.array([[0.2, 0.3], [0.8, 0.2]], np.float32),
        "env/block_colours": np.array([0, 2], np.int64),
        "env/targets": np.array([[0.7, 0.8], [0.2, 0.8]], np.float32),
        "env/target_colours": np.array([2, 0], np.int64),
        "env/held": np.int64(-1),
    }


def expect_error(fn, text):
    try:
        fn()
    except RuntimeError as e:
        assert text in str(e), f"expected {text!r} in the error, got {e}"
        return str(e)
    raise AssertionError(f"no error (expected {text!r})")


def check_expert(host, port, chunk):
    policy = websocket_client_policy.WebsocketClientPolicy(host, port)
    meta = policy.get_server_metadata()
    assert meta["policy"] == "expert" and meta["action_dim"] == 3 and meta["action_horizon"] == chunk, meta
    out = policy.infer(scene())
    a = out["actions"]
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (chunk, 3), (a.dtype, a.shape)
    # Towards the red block at (0.2, 0.3) from (0.5, 0.5): left and up at full speed, gripper open.
    assert np.allclose(a[0], [-0.05, -0.05, -1.0]), a[0]
    assert out["policy_timing"]["infer_ms"] >= 0 and out["server_timing"]["infer_ms"] >= 0, out
    assert "prev_total_ms" not in out["server_timing"], out
    # The swapped instruction: towards the blue block at (0.8, 0.2), right and up.
    out = policy.infer(scene("put the blue block on the red target"))
    assert np.allclose(out["actions"][0], [0.05, -0.05, -1.0]), out["actions"][0]
    assert out["server_timing"]["prev_total_ms"] >= 0, out
    # Nested maps (as ALOHA clients send images) and "state" for the state.
    obs = scene()
    obs["images"] = {"cam_high": obs.pop("observation/image")}
    obs["state"] = obs.pop("observation/state")
    assert policy.infer(obs)["actions"].shape == (chunk, 3)

    # A request the policy cannot serve: the error's text, then the connection closes (1011).
    bad = scene()
    del bad["env/blocks"]
    expect_error(lambda: policy.infer(bad), "no array 'env/blocks'")
    try:
        policy.infer(scene())
        raise AssertionError("the connection stayed open after an error")
    except websockets.exceptions.ConnectionClosedError as e:
        assert e.rcvd.code == 1011, e

    # The server keeps serving: malformed messages on new connections, each named.
    for payload, text in [
        (b"\xc1", "not msgpack"),
        (msgpack_numpy.packb([1, 2]), "is a list, not a map"),
        (msgpack_numpy.packb({"prompt": 3}), "'prompt' is an integer, not a string"),
        (msgpack.packb({"state": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [3]}}),
         "'state': 8 bytes of data for dtype <f4 and shape [3] (12 expected)"),
        (msgpack_numpy.packb({"x": np.zeros(2, np.complex64).view(np.uint64)}), "unsupported dtype '<u8'"),
    ]:
        with websockets.sync.client.connect(f"ws://{host}:{port}", compression=None, max_size=None) as conn:
            msgpack_numpy.unpackb(conn.recv())  # metadata
            conn.send(payload)
            reply = conn.recv()
            assert isinstance(reply, str) and text in reply, (text, reply)
            try:
                conn.recv()
                raise AssertionError("not closed")
            except websockets.exceptions.ConnectionClosed as e:
                assert e.rcvd.code == 1011, e
    again = websocket_client_policy.WebsocketClientPolicy(host, port)
    assert again.infer(scene())["actions"].shape == (chunk, 3)


def check_random(host, port, chunk):
    policy = websocket_client_policy.WebsocketClientPolicy(f"ws://{host}:{port}")
    meta = policy.get_server_metadata()
    assert meta["policy"] == "random" and meta["action_horizon"] == chunk, meta
    a = policy.infer({"observation/state": np.zeros(3, np.float32)})["actions"]
    b = policy.infer({"observation/state": np.zeros(3, np.float32)})["actions"]
    assert a.shape == (chunk, 3) and a.dtype == np.float32, a.shape
    assert np.abs(a[:, :2]).max() <= 0.05 and np.abs(a[:, 2]).max() <= 1.0, a
    assert not np.array_equal(a, b)
    print("FIRST", " ".join(f"{v:.6f}" for v in a[0]))


def pattern_image(k, h=24, w=40):
    # The C++ test draws the same image: (7 y + 3 x + 11 c + 5 k) mod 256.
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    return ((7 * y + 3 * x + 11 * c + 5 * k) % 256).astype(np.uint8)


def check_pi05_lerobot(host, port, chunk):
    policy = websocket_client_policy.WebsocketClientPolicy(host, port)
    meta = policy.get_server_metadata()
    assert meta["policy"] == "pi05" and meta["action_horizon"] == chunk, meta
    obs = {"observation/state": (np.arange(meta["state_dim"], dtype=np.float32) - 1.0) * 0.25,
           "prompt": "pick up the cube"}
    for k, key in enumerate(meta["cameras"]):
        obs["observation/" + key.split(".")[-1]] = pattern_image(k)
    a = policy.infer(obs)["actions"]
    assert a.shape == (chunk, meta["action_dim"]) and a.dtype == np.float32, (a.shape, a.dtype)
    print("ACTIONS", " ".join(repr(float(v)) for v in a.reshape(-1)))
    del obs["observation/" + meta["cameras"][-1].split(".")[-1]]
    print("ERROR", expect_error(lambda: policy.infer(obs), "no image for the dataset's camera"))


def main():
    host, port, mode, chunk = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    {"expert": check_expert, "random": check_random, "pi05_lerobot": check_pi05_lerobot}[mode](host, port, chunk)
    print("OK")


if __name__ == "__main__":
    main()

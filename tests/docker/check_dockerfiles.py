#!/usr/bin/env python3
"""DockerFiles.StepsCallTheProjectScripts: docker/Dockerfile and docker/Dockerfile.xpu parsed and
checked against the project (docs/containers.md); no container engine is needed.

Usage: check_dockerfiles.py [REPO_ROOT]   (default: this file's ../..). Exit 0 when every check
holds, else 1 with one line per failed check naming the file and the instruction."""
import os
import re
import shlex
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
failures = []


def fail(where, what):
    failures.append(f"{where}: {what}")


def instructions(path):
    """(line number, keyword, arguments) per instruction: comments dropped, continuations joined."""
    out, buf, start = [], "", 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            stripped = line.strip()
            if not buf and (not stripped or stripped.startswith("#")):
                continue
            if buf and stripped.startswith("#"):
                continue  # a comment inside a continued instruction
            if not buf:
                start = n
            if stripped.endswith("\\"):
                buf += stripped[:-1] + " "
                continue
            buf += stripped
            keyword, _, args = buf.partition(" ")
            out.append((start, keyword.upper(), args.strip()))
            buf = ""
    if buf:
        fail(path, "ends inside a continued instruction")
    return out


def args_of(ins):
    """ARG name -> default (None when none is given)."""
    found = {}
    for _, k, a in ins:
        if k == "ARG":
            name, eq, default = a.partition("=")
            found[name.strip()] = default.strip().strip('"') if eq else None
    return found


def project_script_calls(ins):
    """[(line, script)] for every tools/<name> a RUN step calls, in order."""
    calls = []
    for n, k, a in ins:
        if k == "RUN":
            for m in re.finditer(r"(?<![\w/.])tools/([\w.-]+)", a):
                calls.append((n, "tools/" + m.group(1)))
    return calls


def env_of(ins):
    env = {}
    for _, k, a in ins:
        if k == "ENV":
            for item in shlex.split(a):
                name, eq, value = item.partition("=")
                if eq:
                    env[name] = value
    return env


def check_common(path, ins):
    rel = os.path.relpath(path, ROOT)
    froms = [(n, a) for n, k, a in ins if k == "FROM"]
    if len(froms) != 1:
        fail(rel, f"expected one FROM, found {len(froms)}")
    if not any(k == "COPY" and a.split()[:2] == [".", "."] for _, k, a in ins):
        fail(rel, "no 'COPY . .': the image must build from the source tree")
    calls = project_script_calls(ins)
    for n, script in calls:
        p = os.path.join(ROOT, script)
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            fail(rel, f"line {n} runs {script}, which is not an executable file of the project")
    order = [s for _, s in calls]
    wanted = ["tools/install-deps", "tools/build", "tools/test"]
    if [s for s in order if s in wanted] != wanted:
        fail(rel, f"the RUN steps call {order}; they must call {wanted}, each once, in that order")
    copy_line = next((n for n, k, a in ins if k == "COPY"), None)
    first_script = calls[0][0] if calls else None
    if copy_line is not None and first_script is not None and first_script < copy_line:
        fail(rel, f"line {first_script} runs a project script before the source tree is copied (line {copy_line})")
    for n, k, a in ins:
        if k == "RUN" and re.search(r"pip3?\s+install|python3?\s+-m\s+pip", a):
            fail(rel, f"line {n} installs Python packages itself; tools/install-deps owns the .venv (torch pin included)")
        if k == "RUN" and re.search(r"libtorch|download\.pytorch\.org", a, re.I):
            fail(rel, f"line {n} fetches LibTorch itself; it comes from the torch wheel tools/install-deps installs")
    test_step = next((a for n, k, a in ins if k == "RUN" and "tools/test" in a), "")
    if "RUN_TESTS" in test_step and args_of(ins).get("RUN_TESTS") != "1":
        fail(rel, "the build-time suite is switchable, so RUN_TESTS must default to 1")
    return froms, env_of(ins)


def torch_pin():
    with open(os.path.join(ROOT, "tools", "install-deps")) as f:
        m = re.search(r"^torch_version=([\d.]+)$", f.read(), re.M)
    return m.group(1) if m else None


def main():
    cuda = os.path.join(ROOT, "docker", "Dockerfile")
    xpu = os.path.join(ROOT, "docker", "Dockerfile.xpu")
    for p in (cuda, xpu):
        if not os.path.isfile(p):
            fail(os.path.relpath(p, ROOT), "missing")
    if failures:
        return report()

    ins = instructions(cuda)
    froms, env = check_common(cuda, ins)
    args = args_of(ins)
    if froms and froms[0][1] not in ("${BASE_IMAGE}", "$BASE_IMAGE") or args.get("BASE_IMAGE") != "debian:12":
        fail("docker/Dockerfile", "the base must be ARG BASE_IMAGE, default debian:12 (what tools/install-deps installs on)")
    pkg = args.get("CUDA_PACKAGE") or ""
    if not re.fullmatch(r"cuda-toolkit-(\d+)-(\d+)", pkg):
        fail("docker/Dockerfile", f"ARG CUDA_PACKAGE '{pkg}' is not an NVIDIA cuda-toolkit-M-N package")
    elif pkg != "cuda-toolkit-13-0":
        fail("docker/Dockerfile", f"{pkg}: the torch=={torch_pin()} wheel is the CUDA 13.0 build; the toolkit must match")
    if not any(k == "RUN" and "${CUDA_PACKAGE}" in a and "apt-get install" in a for _, k, a in ins):
        fail("docker/Dockerfile", "no RUN step installs ${CUDA_PACKAGE}")
    if "repos/debian12/" not in " ".join(a for _, k, a in ins if k == "RUN"):
        fail("docker/Dockerfile", "the CUDA toolkit must come from NVIDIA's Debian 12 repository")
    if not any(k == "ENV" and re.search(r"PATH=/usr/local/cuda/bin(:|$)", a) for _, k, a in ins):
        fail("docker/Dockerfile", "PATH lacks /usr/local/cuda/bin (nvcc)")
    if "-DLOONGFORGE_CUDA=ON" not in env.get("LOONGFORGE_CMAKE_ARGS", ""):
        fail("docker/Dockerfile", "LOONGFORGE_CMAKE_ARGS must switch the CUDA module on (-DLOONGFORGE_CUDA=ON)")
    if torch_pin() != "2.11.0":
        fail("tools/install-deps", f"torch_version={torch_pin()}: the images and docs/containers.md name the 2.11.0 "
             "wheel (CUDA 13.0)")

    ins = instructions(xpu)
    froms, env = check_common(xpu, ins)
    args = args_of(ins)
    if not froms or froms[0][1] not in ("${XPU_BASE_IMAGE}", "$XPU_BASE_IMAGE"):
        fail("docker/Dockerfile.xpu", "FROM must be the vendor's image, ${XPU_BASE_IMAGE}")
    for name in ("XPU_BASE_IMAGE", "XPU_PLUGIN"):
        if name not in args:
            fail("docker/Dockerfile.xpu", f"no ARG {name}")
        elif args[name] is not None:
            fail("docker/Dockerfile.xpu", f"ARG {name} has a default ({args[name]}); it must be given by the user")
    first_run = next((a for _, k, a in ins if k == "RUN"), "")
    if not re.search(r'test -n "\$\{XPU_PLUGIN\}"', first_run):
        fail("docker/Dockerfile.xpu", "the first RUN step must stop the build when XPU_PLUGIN is not given")
    if "-DLOONGFORGE_CUDA=OFF" not in env.get("LOONGFORGE_CMAKE_ARGS", ""):
        fail("docker/Dockerfile.xpu", "LOONGFORGE_CMAKE_ARGS must switch the CUDA module off")
    if env.get("LOONGFORGE_DEVICE") != "xpu":
        fail("docker/Dockerfile.xpu", "ENV LOONGFORGE_DEVICE must be xpu (the backend selection, docs/backends.md)")
    if env.get("LOONGFORGE_XPU_PLUGIN") not in ("${XPU_PLUGIN}", "$XPU_PLUGIN"):
        fail("docker/Dockerfile.xpu", "ENV LOONGFORGE_XPU_PLUGIN must be the XPU_PLUGIN build argument")

    ignore = os.path.join(ROOT, ".dockerignore")
    lines = open(ignore).read().split() if os.path.isfile(ignore) else []
    for entry in ("build/", ".venv/", ".venv-*/"):
        if entry not in lines:
            fail(".dockerignore", f"lacks {entry}: a local build or virtual environment would enter the image")
    return report()


def report():
    for f in failures:
        print("FAIL " + f)
    if not failures:
        print("docker/Dockerfile and docker/Dockerfile.xpu: every check holds")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

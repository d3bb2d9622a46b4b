#!/usr/bin/env bash
# Fetch, HERE (where pip reaches an index), the wheels that bench/gpu_checks.sh needs on a device
# machine that cannot download anything: the versions this environment runs, of the packages the
# device image lacks or holds older (pydantic is missing there; transformers and peft are older).
#
#     bash bench/gpu_wheels.sh          # -> .whl/ (git-ignored through .git/info/exclude)
#
# Then carry .whl with the device call; gpu_checks.sh installs it into /tmp/site when present.
set -eu
py="${PYTHON:-python3}"
dest=".whl"
mkdir -p "$dest"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
pins=$("$py" - <<'PY'
import importlib.metadata as m
names = (
    "transformers", "peft", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "typing-extensions", "megatron-core",
)
print(" ".join(f"{n}=={m.version(n)}" for n in names))
PY
)
echo "fetching: $pins"
# shellcheck disable=SC2086
"$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dest" $pins
ls -la "$dest"

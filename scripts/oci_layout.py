"""Write an OCI image layout from a rootfs tar on stdin (for scripts/build_cpu_test_image.sh).

    tar -C ROOT -cf - . | python3 scripts/oci_layout.py DIR TAG [ENV=VALUE...] [-- LABEL=VALUE...]

One layer, gzip level 1 (a registry wants compressed layers; level 1 because the layer is GBs and this runs on
2 cores: the bytes go over loopback), compressed and hashed in one pass. `skopeo copy oci:DIR:TAG docker://...`
pushes it as it is. Prints the manifest's digest.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from pathlib import Path

CHUNK = 1 << 20


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def main(argv: list[str]) -> int:
    root, tag, rest = Path(argv[0]), argv[1], argv[2:]
    env, labels = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    raw, packed = hashlib.sha256(), hashlib.sha256()
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    tmp = root / "layer.tmp"
    size = 0
    with open(tmp, "wb") as out:
        while chunk := sys.stdin.buffer.read(CHUNK):
            raw.update(chunk)
            for part in (z.compress(chunk),):
                packed.update(part)
                out.write(part)
                size += len(part)
        part = z.flush()
        packed.update(part)
        out.write(part)
        size += len(part)
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + packed.hexdigest(),
             "size": size}
    tmp.rename(root / "blobs" / "sha256" / packed.hexdigest())
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": env, "Labels": dict(label.split("=", 1) for label in labels)},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + raw.hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(root, config)},
        "layers": [layer]}).encode()
    m = _blob(root, manifest)
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
        "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    print(m["digest"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

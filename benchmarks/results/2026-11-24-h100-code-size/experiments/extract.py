"""Step 2 of 3 (here, needs the zstandard package): the code of each NVIDIA pipeline-cache file
sass.py wrote, into spv/code/<name>.bin for disasm.sh. As read from these caches (driver
580.159.04): after a 100-byte header, a zstd frame holding an "NVuc" image whose uint32 at 76
is the code's size and at 80 its offset, the code starting 8 bytes after that.

    python extract.py DIR_OF_CACHE_FILES"""
import struct
import sys
from pathlib import Path

import zstandard

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    out = HERE / "spv" / "code"
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(sys.argv[1]).glob("*.cache")):
        blob = f.read_bytes()
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(blob[blob.find(bytes.fromhex("28b52ffd")):])
        assert raw.startswith(b"NVDANVVMNVuc"), f"{f}: not the layout this script knows"
        size, off = struct.unpack_from("<II", raw, 76)
        (out / f"{f.stem}.bin").write_bytes(raw[off + 8:off + 8 + size])
        print(f"{f.stem}: {size} B of code")

"""Structured extraction from an image: a receipt drawn with Pillow, read by a vision model into a JSON-schema-valid
object (store, date, items, total). Runs offline.

    python examples/receipt_extraction.py --model /path/to/llava-or-qwen2-vl   # a real vision model folder
    python examples/receipt_extraction.py --url http://127.0.0.1:30000          # a running `sglpy serve --model ...`
    python examples/receipt_extraction.py                                        # a tiny random LLaVA (random answers,
                                                                                 # still schema-valid)
"""

import json
import sys
import tempfile

from PIL import Image, ImageDraw

import sglpy as sgl

AMOUNT = r"^\d{1,4}\.\d{2}$"  # amounts as printed (bounded, so even a random model's answer ends)
RECEIPT_SCHEMA = {
    "type": "object",
    "properties": {
        "store": {"type": "string", "maxLength": 24},
        "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "items": {"type": "array", "maxItems": 4, "items": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "price": {"type": "string", "pattern": AMOUNT}},
            "required": ["name", "price"], "additionalProperties": False}},
        "total": {"type": "string", "pattern": AMOUNT},
    },
    "required": ["store", "date", "items", "total"],
    "additionalProperties": False,
}

LINES = [("CORNER MARKET", None), ("2026-03-14", None), ("Bread", 2.40), ("Milk", 1.15), ("Apples", 3.20)]


def draw_receipt() -> Image.Image:
    """A receipt image: store, date, priced lines and the total, in black on white."""
    img = Image.new("RGB", (336, 336), "white")
    d = ImageDraw.Draw(img)
    y = 16
    for text, price in LINES:
        d.text((24, y), text, fill="black")
        if price is not None:
            d.text((250, y), f"{price:.2f}", fill="black")
        y += 28
    d.line((24, y, 312, y), fill="black")
    d.text((24, y + 10), "TOTAL", fill="black")
    d.text((250, y + 10), f"{sum(p for _, p in LINES if p):.2f}", fill="black")
    return img


@sgl.function
def read_receipt(s, receipt):
    s += sgl.user(sgl.image(receipt) + "Extract the store, date, items and total of this receipt as JSON.")
    s += sgl.assistant(sgl.gen("receipt", json_schema=RECEIPT_SCHEMA, max_tokens=320, temperature=0))


def backend_from_args():
    """--url URL: a running server; --model PATH: an in-process engine; neither: a tiny random LLaVA."""
    if "--url" in sys.argv:
        return sgl.RuntimeEndpoint(sys.argv[sys.argv.index("--url") + 1])
    if "--model" in sys.argv:
        return sgl.Engine(sys.argv[sys.argv.index("--model") + 1])
    from sglpy.runtime.testing.tiny_vlm import make_tiny_llava

    folder = make_tiny_llava(tempfile.mkdtemp(prefix="sglpy-receipt-") + "/llava")
    return sgl.Engine(folder, quantization="none")


def main(backend=None):
    """Read one drawn receipt; return the parsed object."""
    backend = backend or backend_from_args()
    state = read_receipt.run(receipt=draw_receipt(), backend=backend)
    obj = json.loads(state["receipt"])
    print(json.dumps(obj, indent=2))
    return obj


if __name__ == "__main__":
    main()

"""JSON-schema extraction: pull structured fields out of free text into a schema-valid object."""

import json

import sglpy as sgl
from example_backend import default_backend

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 30},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@sgl.function
def extract(s, text):
    s += sgl.system("You extract facts as JSON.")
    s += sgl.user("Extract name, age and city from: " + text)
    s += sgl.assistant(sgl.gen("person", json_schema=PERSON_SCHEMA, max_tokens=64))


def main(backend=None):
    """Extract two people; return the parsed objects (None where the runtime ignored the schema)."""
    backend = backend or default_backend()
    texts = ["Maria is 34 and lives in Lisbon.", "Tom, aged 51, moved to Oslo last year."]
    states = extract.run_batch([{"text": t} for t in texts], temperature=0, backend=backend)
    out = []
    for t, st in zip(texts, states):
        try:
            obj = json.loads(st["person"])
        except ValueError:
            obj = None
        print(t, "->", obj if obj is not None else f"{st['person']!r} (schema not enforced by this runtime)")
        out.append(obj)
    return out


if __name__ == "__main__":
    main()

"""How the Python benchmark tools hand over their results: the markdown table on stdout and,
given --out OUT, OUT.json (the whole document) and OUT.md (the table)."""
import json


def write_results(doc, text, out):
    print(text)
    if out:
        with open(out + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        with open(out + ".md", "w") as f:
            f.write(text)

#!/usr/bin/env python3
"""Builds the tokenizer and chat-template fixtures of tests/test_tokenizer.c from the reference implementations.

  python3 scripts/make_tokenizer_fixtures.py [--tokenizer-dir /work/shared/testdata/qwen3-tokenizer]
                                             [--out tests/fixtures/tokenizer]

Writes (deterministic: the corpus comes from a seeded generator):
  corpus.jsonl  one JSON object per line: {"c": category, "t": text} or {"c", "b": hex of the raw bytes, for
                text that is not valid UTF-8 or holds a NUL}, "ids": HF `tokenizers` ids of the text (for raw bytes: of
                bytes.decode("utf-8", "replace"), the U+FFFD-replaced string, as Rust's from_utf8_lossy gives),
                "ns": ids with special-token parsing off (only where the text contains an added token's text),
                "rt": 1 when the bytes are valid UTF-8 and HF decodes the ids back to exactly the text.
  chat.jsonl    {"messages": [...], "gen": add_generation_prompt, "think": enable_thinking, "out": rendered}
                from transformers' apply_chat_template when transformers imports, else from jinja2 set up the way
                transformers sets it up (the "renderer" field of the first line says which).

Special-token parsing off follows llama.cpp: control tokens (HF "special", or looking like "<|...|>") are not
matched, user-defined ones (<think>, <tool_call>, ...) are. HF's encode_special_tokens=True differs only for the
non-special "<|...|>" tokens, so "ns" is computed by HF with those flagged special.
"""
import argparse
import json
import os
import random
import unicodedata

from tokenizers import Tokenizer

SEED = 20240607
SPECIAL_FLAGGED = set()  # the added tokens tokenizer.json itself marks special


def english(rng):
    words = ("the of and to in is it you that he was for on are with as his they be at one have this from or had by "
             "hot word but what some we can out other were all there when up use your how said an each she which do "
             "their time if will way about many then them write would like so these her long make thing see him two "
             "has look more day could go come did number sound no most people my over know water than call first who "
             "may down side been now find any new work part take get place made live where after back little only "
             "round man year came show every good me give our under name very through just form sentence great think "
             "say help low line differ turn cause much mean before move right boy old too same tell does set three "
             "want air well also play small end put home read hand port large spell add even land here must big high "
             "such follow act why ask men change went light kind off need house picture try us again animal point "
             "mother world near build self earth father head stand own page should country found answer school grow "
             "study still learn plant cover food sun four between state keep eye never last let thought city tree "
             "cross farm hard start might story saw far sea draw left late run don't while press close night real "
             "life few north open seem together next white children begin got walk example ease paper group always "
             "music those both mark often letter until mile river car feet care second book carry took science eat "
             "room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main "
             "Tokenization Internationalization antidisestablishmentarianism GPT-4 iPhone McDonald's O'Reilly").split()
    n = rng.randint(1, 40)
    out = []
    for i in range(n):
        w = rng.choice(words)
        r = rng.random()
        if r < 0.08:
            w = w.capitalize()
        elif r < 0.11:
            w = w.upper()
        elif r < 0.16:
            w += rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "\u2019s", "'x"])
        out.append(w)
        if rng.random() < 0.15:
            out[-1] += rng.choice([",", ".", "!", "?", ";", ":", "...", ")", "\"", " -", "--"])
    s = " ".join(out)
    if rng.random() < 0.3:
        s = rng.choice(["", " ", "  ", "\n", "(", "\""]) + s + rng.choice(["", " ", "\n", "\n\n", ".\n"])
    return s


CODE = [
    "int main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);\n    return 0;\n}\n",
    "def {f}(x, y=None):\n    \"\"\"Return the {f} of x.\"\"\"\n    if y is None:\n        return x ** 2\n    return [v * y for v in x]\n",
    "const {f} = async (url) => {{\n  const res = await fetch(url);\n  return res.json();\n}};\nexport default {f};\n",
    "fn {f}(v: &[u32]) -> Option<u32> {{\n    v.iter().copied().max()\n}}\n\n#[cfg(test)]\nmod tests {{}}\n",
    "func {f}(w http.ResponseWriter, r *http.Request) {{\n\tfmt.Fprintf(w, \"hi %s\", r.URL.Path[1:])\n}}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id;",
    "<div class=\"{f}\">\n  <a href=\"https://example.com/{f}?q=1&amp;r=2\">link</a>\n</div>\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | tr 'a-z' 'A-Z' >> out.log\ndone\n",
    "public static void {f}(String[] args) {{\n\t\tSystem.out.println(\"Hello, \" + args[0]);\n\t}}\n",
    "{{\"name\": \"{f}\", \"version\": \"1.2.3\", \"deps\": {{\"a\": \"^0.1\", \"b\": null}}, \"list\": [1, 2.5e-3, -7]}}",
    "x = np.zeros((3, 4), dtype=np.float32)\ny = x @ x.T  # shape (3, 3)\nprint(f\"{{y.sum():.3f}}\")\n",
    "template <typename T>\nstd::vector<T> {f}(const std::vector<T>& v) {{ return {{v.rbegin(), v.rend()}}; }}\n",
    "    if (err != nil) {{\n\t\treturn nil, err\n\t}}\r\n\r\n",
    "\\begin{{equation}} E = mc^2 \\quad \\sum_{{i=1}}^{{n}} x_i \\end{{equation}}",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&&=i||j??k;l!==m===n;o=>p->q::r",
]


def code(rng):
    f = rng.choice(["foo", "bar_baz", "computeTotal", "Parse", "x1", "__init__", "getUserById", "v2Handler"])
    s = rng.choice(CODE).replace("{f}", f).replace("{{", "{").replace("}}", "}")
    if rng.random() < 0.3:
        s = s.replace("    ", "\t")
    if rng.random() < 0.2:
        s = s.replace("\n", "\r\n")
    if rng.random() < 0.3:
        s = "  " * rng.randint(1, 6) + s
    return s


def digits(rng):
    k = rng.randint(0, 5)
    if k == 0:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60)))
    if k == 1:
        return f"{rng.randint(0, 10**9)}.{rng.randint(0, 999999)} and {rng.randint(-5000, 5000)}"
    if k == 2:
        return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if k == 3:
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(8, 64)))
    if k == 4:
        return " ".join(str(rng.randint(0, 10**rng.randint(1, 12))) for _ in range(rng.randint(1, 12)))
    return rng.choice(["\u0661\u0662\u0663", "\u0967\u0968\u0969", "\uff11\uff12\uff13", "\u2460\u2461", "\u00bd\u00b2\u00b3",
                       "\u4e00\u4e8c\u4e09", "1\u00a0000", "3\u00d710\u2078", "\u216b"]) + str(rng.randint(0, 99))


WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\n ", "\t\t", "\u00a0", "\u3000", "\u2028", "\u2029",
      "\u0085", "\x0b", "\x0c", "\u2003", "\u200b", "\ufeff", "\u180e", "\x1c", "\x1f", "\u202f", "\u205f", " \u0085 "]


def whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        parts.append("".join(rng.choice(WS) for _ in range(rng.randint(1, 5))))
        if rng.random() < 0.6:
            parts.append(rng.choice(["a", "word", "X", "1", "!", "é", "\u4e2d", ".", "\ud83d\ude00", "--"]))
    return "".join(parts)


SCRIPTS = {
    "cjk": ["\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
            "\u6df1\u5ea6\u5b66\u4e60\u6a21\u578b\u7684\u63a8\u7406\u901f\u5ea6\u975e\u5e38\u91cd\u8981",
            "\u79c1\u306f\u65e5\u672c\u8a9e\u3092\u52c9\u5f37\u3057\u3066\u3044\u307e\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3082\u3002",
            "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc744 \ud1a0\ud070\ud654\ud569\ub2c8\ub2e4. \uac10\uc0ac\ud569\ub2c8\ub2e4!",
            "\u300c\u5f15\u7528\u300d\u3001\uff08\u62ec\u5f27\uff09\u3010\u6ce8\u3011\u2026\u2026\uff01\uff1f",
            "\u7e41\u9ad4\u4e2d\u6587\u8207\u7b80\u4f53\u4e2d\u6587\u6df7\u5408\u3002\ud840\udc0b\ud87e\udc04"],
    "arabic": ["\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",
               "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629 \u062c\u062f\u0627\u064b \u0664\u0665",
               "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u05de\u05d4 \u05e9\u05dc\u05d5\u05de\u05da?"],
    "devanagari": ["\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e! \u092f\u0939 \u090f\u0915 \u092a\u0930\u0940\u0915\u094d\u0937\u0923 \u0939\u0948\u0964",
                   "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0936\u094d\u0930\u0940",
                   "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
                   "\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd \u0ba4\u0bae\u0bbf\u0bb4\u0bcd"],
    "other": ["\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.",
              "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5 \u03c2\u03a3",
              "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0532\u0561\u0580\u0565\u0582",
              "Stra\u00dfe \u0130stanbul \u0131\u0130 \ufb01 \u1e9e \u00c5ngstr\u00f6m \u212b \u2126"],
}

EMOJI = ["\ud83d\ude00", "\ud83d\udc4d\ud83c\udffd", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66",
         "\ud83c\udff3\ufe0f\u200d\ud83c\udf08", "\ud83c\uddfa\ud83c\uddf8", "\ud83c\uddef\ud83c\uddf5", "1\ufe0f\u20e3",
         "\u2764\ufe0f", "\ud83e\uddd1\u200d\ud83d\udcbb", "\ud83d\udc69\ud83c\udfff\u200d\ud83d\ude80", "\u263a",
         "\ud83e\udd8a", "\ud83c\udff4\udb40\udc67\udb40\udc62\udb40\udc65\udb40\udc6e\udb40\udc67\udb40\udc7f", "\u200d", "\ufe0f"]


def fix_surrogates(s):
    return s.encode("utf-16", "surrogatepass").decode("utf-16")


def scripts(rng, key):
    s = fix_surrogates(rng.choice(SCRIPTS[key]))
    if rng.random() < 0.5:
        s += " " + english(rng)[:30]
    if rng.random() < 0.3:
        s = "".join(rng.choice([c, c + c]) for c in s)
    return s


def emoji(rng):
    return "".join(fix_surrogates(rng.choice(EMOJI)) + rng.choice(["", "", " ", "a", "\n", "!"])
                   for _ in range(rng.randint(1, 10)))


def nfd(rng):
    base = rng.choice(["caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe", "\u00c5ngstr\u00f6m \u00e7a va \u00f1and\u00fa",
                       "Vi\u1ec7t Nam ti\u1ebfng Vi\u1ec7t \u0111\u1eb9p", "\ud55c\uad6d\uc5b4 \uac00\ub098\ub2e4",
                       "\u1e69\u0323\u0307 q\u0307\u0323 e\u0301\u0301", "\u00e9l\u00e8ve fran\u00e7ais \u00e0 l'\u00e9cole"])
    s = fix_surrogates(base)
    k = rng.randint(0, 4)
    if k == 0:
        return unicodedata.normalize("NFD", s)
    if k == 1:
        return unicodedata.normalize("NFKD", s)
    if k == 2:  # combining marks in odd places: after spaces, digits, special tokens, at the start
        return rng.choice(["\u0301", " \u0301", "1\u0308", "<think>\u0338", ">\u0338", "=\u0338", "a\u0328\u0301",
                           "\u0338<|im_end|>"]) + unicodedata.normalize("NFD", s)
    if k == 3:
        return "".join(unicodedata.normalize("NFD", c) if rng.random() < 0.5 else c for c in s)
    return "\u212b\u2126\u0041\u030a \u1100\u1161\u11a8 \u0e40\u0e01\u0e49\u0e32\u0e35 " + s


ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
         "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
         "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
         "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
         "<think>", "</think>"]
NEAR = ["<|im_start", "im_end|>", "<think", "</think", "<|", "|>", "<<|im_end|>", "<|im_end|>>", "<|IM_END|>",
        "< think>", "<think >", "<|endoftext|", "</think></think>", "<<think>>"]


def specials(rng):
    parts = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.45:
            parts.append(rng.choice(ADDED))
        elif r < 0.6:
            parts.append(rng.choice(NEAR))
        else:
            parts.append(rng.choice([english(rng)[:20], "\n", " ", "user\n", "assistant\n", "x", "\u4e2d\u6587", "  "]))
    return "".join(parts)


def invalid_bytes(rng):
    pieces = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",
              b"\xf8\x88\x80\x80\x80", b"\x80", b"\xbf\xbf", b"\xe4\xbd", b"\xe4", b"\xf0\x9f\x98", b"\xf0\x9f",
              b"\xc3", b"\xc2\x41", b"\xe2\x82\x28", b"\xf0\x28\x8c\x28", b"\xc1\xbf", b"\xf5\x80\x80\x80"]
    out = b""
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.4:
            out += rng.choice(pieces)
        elif r < 0.55:
            out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        elif r < 0.7:
            out += fix_surrogates(rng.choice(["\u00e9t\u00e9", "\u4e2d\u6587", "\ud83d\ude00", "<|im_end|>", " "])).encode()
        else:
            out += english(rng)[:25].encode()
    return out


def long_words(rng):
    k = rng.randint(0, 9)
    n = rng.randint(200, 3000)
    if k == 0:
        return rng.choice("abcxyz") * n
    if k == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if k == 2:
        return "".join(rng.choice("0123456789") for _ in range(n // 2))
    if k == 3:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(n))
    if k == 4:
        return "https://example.com/" + "/".join("seg" + str(i) for i in range(n // 8)) + "?a=1"
    if k == 5:
        return " " * rng.randint(100, 3000) + "x"
    if k == 6:
        return "\n" * rng.randint(50, 500) + " " * rng.randint(0, 50)
    if k == 7:
        return fix_surrogates("\ud83d\ude00") * rng.randint(50, 400)
    if k == 8:
        return "=" * rng.randint(100, 1000) + "-" * 100
    return "\u4e2d" * rng.randint(100, 1000)


def random_unicode(rng):
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x20a0, 0x214f), (0x2190, 0x23ff),
              (0x2500, 0x27bf), (0x3000, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xad00), (0xe000, 0xe0ff),
              (0xfb00, 0xfb4f), (0xfe00, 0xfe6f), (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x1f300, 0x1f6ff),
              (0x1f900, 0x1f9ff), (0x20000, 0x200ff), (0xe0000, 0xe007f), (0x0, 0x1f)]
    out = []
    for _ in range(rng.randint(1, 30)):
        lo, hi = rng.choice(blocks)
        cp = rng.randint(lo, hi)
        if 0xd800 <= cp <= 0xdfff:
            continue
        out.append(chr(cp))
    return "".join(out)


def contractions(rng):
    base = rng.choice(["it", "IT", "we", "They", "I", "you", "x", "1", " ", "", "\u00e9", "\u4e2d"])
    tail = rng.choice(["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL",
                       "'d", "'D", "'\u017f", "'\u212a", "'sx", "''s", "'", "' s", "\u2019ll", "'lls", "'dd", "'tt"])
    return base + tail + rng.choice(["", " ", "s", "!", "\n", "'s"])


GENERATORS = [
    ("english", english, 500), ("code", code, 250), ("digits", digits, 150), ("whitespace", whitespace, 200),
    ("cjk", lambda r: scripts(r, "cjk"), 120), ("arabic", lambda r: scripts(r, "arabic"), 80),
    ("devanagari", lambda r: scripts(r, "devanagari"), 80), ("scripts", lambda r: scripts(r, "other"), 60),
    ("emoji", emoji, 120), ("nfd", nfd, 150), ("special", specials, 200), ("invalid", invalid_bytes, 120),
    ("long", long_words, 40), ("unicode", random_unicode, 150), ("contractions", contractions, 120),
]

FIXED = ["", " ", "a", "\n", "Hello world", "Hello, world!", "<|im_start|>user\nhi<|im_end|>\n", "<think>\n\n</think>\n\n",
         "don't", "I'm", "\u00e9", "e\u0301", "\ud55c", "\u1112\u1161\u11ab", "\ufeffBOM", "\x00", "a\x00b", "\u0085",
         "\r\n\r\n", "   \n   ", "\t\t\t", "1234567890", "3.14159", "$$$", "...", "\u2026", "  hello  ", "\u00a0\u00a0x"]


def build_corpus():
    rng = random.Random(SEED)
    items = [("fixed", s) for s in FIXED]
    for name, gen, count in GENERATORS:
        seen = set()
        tries = 0
        while len(seen) < count and tries < count * 20:
            tries += 1
            s = gen(rng)
            if s in seen:
                continue
            seen.add(s)
            items.append((name, fix_surrogates(s) if isinstance(s, str) else s))
    return items


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--tokenizer-dir", default="/work/shared/testdata/qwen3-tokenizer")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer"))
    a = ap.parse_args()
    tj = os.path.join(a.tokenizer_dir, "tokenizer.json")
    tok = Tokenizer.from_file(tj)
    # llama.cpp's no-special rule: control = HF special or "<|...|>"-looking.
    data = json.load(open(tj, encoding="utf-8"))
    SPECIAL_FLAGGED.update(t["content"] for t in data["added_tokens"] if t["special"])
    for t in data["added_tokens"]:
        c = t["content"]
        if c.startswith("<|") and c.endswith("|>"):
            t["special"] = True
    tok_ns = Tokenizer.from_str(json.dumps(data))
    tok_ns.encode_special_tokens = True
    added = [t["content"] for t in data["added_tokens"]]

    os.makedirs(a.out, exist_ok=True)
    n = 0
    used_ids = set()
    with open(os.path.join(a.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for cat, s in build_corpus():
            rec = {"c": cat}
            raw = s if isinstance(s, bytes) else s.encode("utf-8")
            text = raw.decode("utf-8", "replace")
            try:
                raw.decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            if valid and "\x00" not in text:
                rec["t"] = text
            else:  # raw bytes as hex: invalid UTF-8, or a NUL that C strings could not carry
                rec["b"] = raw.hex()
            ids = tok.encode(text, add_special_tokens=False).ids
            rec["ids"] = ids
            used_ids.update(ids)
            if any(t in text for t in added):
                rec["ns"] = tok_ns.encode(text, add_special_tokens=False).ids
                used_ids.update(rec["ns"])
            if valid and tok.decode(ids, skip_special_tokens=False) == text:
                rec["rt"] = 1
            f.write(json.dumps(rec, ensure_ascii=True, separators=(",", ":")) + "\n")
            n += 1
    print(f"corpus.jsonl: {n} strings")
    write_subset(a, data, used_ids)
    write_chat(a)


def write_subset(a, data, used_ids):
    """tokenizer_subset.json: tokenizer.json cut down to the merges that produce the corpus's tokens, so CI needs
    no 11 MB download. Every non-byte token of Qwen's vocabulary is made by exactly one merge, so the merges
    applied while encoding the corpus are the closure of the final tokens under "made by". Any merge outside
    that set is never the lowest-ranked applicable pair on these inputs, so dropping it changes no result (the
    check below re-encodes the corpus with the subset to be sure). Ids stay the same; the gaps become [PAD]."""
    model = data["model"]
    vocab = model["vocab"]
    inv = {v: k for k, v in vocab.items()}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    made_by = {l + r: (l, r) for (l, r) in merges}
    keep_tok, keep_merge = set(), set()
    stack = [inv[i] for i in used_ids if i in inv]
    while stack:
        t = stack.pop()
        if t in keep_tok:
            continue
        keep_tok.add(t)
        if t in made_by:
            keep_merge.add(made_by[t])
            stack.extend(made_by[t])
    from tokenizers.pre_tokenizers import ByteLevel
    for t in ByteLevel.alphabet():
        keep_tok.add(t)
    sub = dict(data)
    sub["model"] = dict(model)
    sub["model"]["vocab"] = {k: v for k, v in vocab.items() if k in keep_tok}
    sub["model"]["merges"] = [list(m) for m in merges if m in keep_merge]
    for t in sub["added_tokens"]:  # undo the no-special flagging done for tok_ns
        t["special"] = t["content"] in SPECIAL_FLAGGED
    path = os.path.join(a.out, "tokenizer_subset.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(sub, f, ensure_ascii=False, separators=(",", ":"))
    import shutil
    shutil.copy(os.path.join(a.tokenizer_dir, "tokenizer_config.json"), os.path.join(a.out, "tokenizer_config.json"))
    st = Tokenizer.from_file(path)
    full = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    for line in open(os.path.join(a.out, "corpus.jsonl"), encoding="utf-8"):
        rec = json.loads(line)
        text = rec["t"] if "t" in rec else bytes.fromhex(rec["b"]).decode("utf-8", "replace")
        # Compared as token strings: HF renumbers added tokens of a vocabulary with gaps (our loader does not).
        assert st.encode(text, add_special_tokens=False).tokens == full.encode(text, add_special_tokens=False).tokens
    print(f"tokenizer_subset.json: {len(sub['model']['vocab'])} tokens, {len(sub['model']['merges'])} merges, "
          "corpus tokens identical to the full tokenizer's")


CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"},
     {"role": "assistant", "content": "<think>\nLet me think about Q1.\n</think>\n\nA1"},
     {"role": "user", "content": "Q2"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nanswer"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "plain answer"}],
    [{"role": "user", "content": "Q"},
     {"role": "assistant", "content": "x</think>\n\n\nfinal", "reasoning_content": "given reasoning\n"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>r1</think>b"},
     {"role": "user", "content": "c"}, {"role": "assistant", "content": "<think>\n\nr2\n\n</think>d"},
     {"role": "user", "content": "e"}],
    [{"role": "user", "content": "run tool"}, {"role": "assistant", "content": "<think>plan</think>calling"},
     {"role": "tool", "content": "result 1"}, {"role": "tool", "content": "result 2"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "r"},
     {"role": "assistant", "content": "<think>after tool</think>a2"}],
    [{"role": "user", "content": "<tool_response>x</tool_response>"}, {"role": "assistant", "content": "<think>t</think>y"}],
    [{"role": "system", "content": "S"}, {"role": "system", "content": "second system"}, {"role": "user", "content": "u"}],
    [{"role": "user", "content": "\u4f60\u597d\uff0c\u4e16\u754c \ud83d\ude00\n\n  spaced  "},
     {"role": "assistant", "content": "<think>\n\u601d\u8003\n</think>\n\n\u4f60\u597d"}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>one</think><think>two</think>\nthree</think>\nfour"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "no open tag</think>rest"},
     {"role": "user", "content": "b"}, {"role": "assistant", "content": "<think></think>"}],
    [{"role": "user", "content": "q"}, {"role": "developer", "content": "ignored role"}, {"role": "user", "content": "q2"}],
    [{"role": "system", "content": "only system"}],
    [{"role": "assistant", "content": "<think>x</think>starts with assistant"}],
]


def write_chat(a):
    msgs_variants = []
    for m in CHATS:
        for gen in (True, False):
            for think in (True, False):
                msgs_variants.append((m, gen, think))
    renderer = None
    try:
        from transformers import AutoTokenizer
        ht = AutoTokenizer.from_pretrained(a.tokenizer_dir)

        def render(m, gen, think):
            return ht.apply_chat_template(m, tokenize=False, add_generation_prompt=gen, enable_thinking=think)
        import transformers
        renderer = "transformers " + transformers.__version__
    except Exception as e:  # noqa: BLE001 - any import/setup failure falls back to jinja2
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False, **k)
        tmpl = env.from_string(json.load(open(os.path.join(a.tokenizer_dir, "tokenizer_config.json")))["chat_template"])

        def render(m, gen, think):
            return tmpl.render(messages=m, add_generation_prompt=gen, enable_thinking=think)
        renderer = f"jinja2 {jinja2.__version__} (transformers unavailable: {type(e).__name__})"
    with open(os.path.join(a.out, "chat.jsonl"), "w", encoding="utf-8") as f:
        for i, (m, gen, think) in enumerate(msgs_variants):
            rec = {"messages": m, "gen": gen, "think": think, "out": render(m, gen, think)}
            if i == 0:
                rec["renderer"] = renderer
            f.write(json.dumps(rec, ensure_ascii=True, separators=(",", ":")) + "\n")
    print(f"chat.jsonl: {len(msgs_variants)} renderings by {renderer}")


if __name__ == "__main__":
    main()

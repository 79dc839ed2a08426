"""Risk flags: why a near neighbour in the semantic cache may still need a different answer.

Rule-based and offline (no spaCy): negation or opposite words in one prompt only, numbers
or units that differ, quoted values or named entities that differ. Each flag names the
words that triggered it. Embedding and cache logic live in `engine.semantic.cache`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

FLAG_KINDS = ("negation", "number", "entity")

_NEGATORS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor",
    "without", "cannot", "hardly", "barely", "lack", "lacks", "lacking", "except", "non",
})
# "n't" is split off by the tokenizer; these forms drop more than the suffix.
_CONTRACTIONS = {"can't": "can not", "won't": "will not", "shan't": "shall not", "cannot": "can not"}
_NEGATIVE_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "anti", "a", "ab")
# Opposites that flip the answer while barely moving the embedding. Kept to pairs whose
# members are rarely swapped in a paraphrase.
_OPPOSITES = [
    ("safe", "dangerous"), ("before", "after"), ("increase", "decrease"), ("more", "less"),
    ("most", "least"), ("maximum", "minimum"), ("max", "min"), ("true", "false"),
    ("allow", "forbid"), ("allowed", "forbidden"), ("include", "exclude"), ("add", "remove"),
    ("buy", "sell"), ("hot", "cold"), ("higher", "lower"), ("best", "worst"), ("above", "below"),
    ("import", "export"), ("win", "lose"), ("first", "last"), ("positive", "negative"),
    ("pros", "cons"), ("advantages", "disadvantages"), ("benefits", "drawbacks"),
    ("fastest", "slowest"), ("faster", "slower"), ("largest", "smallest"), ("bigger", "smaller"),
    ("larger", "smaller"), ("cheapest", "most expensive"), ("cheaper", "more expensive"),
    ("encode", "decode"), ("encrypt", "decrypt"), ("compress", "decompress"), ("start", "stop"),
    ("open", "close"), ("always", "never"), ("ascending", "descending"), ("upper", "lower"),
    ("uppercase", "lowercase"), ("inner", "outer"), ("left", "right"), ("north", "south"),
    ("east", "west"), ("love", "hate"), ("like", "dislike"), ("accept", "reject"),
    ("gain", "lose"), ("enable", "disable"), ("push", "pull"), ("input", "output"),
    ("early", "late"), ("earlier", "later"), ("old", "new"), ("oldest", "newest"),
    ("young", "old"), ("easy", "hard"), ("easiest", "hardest"), ("healthy", "unhealthy"),
    ("legal", "illegal"), ("rise", "fall"), ("raise", "lower"), ("long", "short"),
    ("longest", "shortest"), ("longer", "shorter"), ("heavy", "light"), ("wet", "dry"),
    ("happy", "sad"), ("success", "failure"), ("strengths", "weaknesses"), ("strong", "weak"),
    ("male", "female"), ("men", "women"), ("day", "night"), ("morning", "evening"),
    ("summer", "winter"), ("spring", "autumn"), ("arrive", "leave"), ("inside", "outside"),
    ("public", "private"), ("good", "bad"), ("turn on", "turn off"), ("switch on", "switch off"),
    ("log in", "log out"), ("lock", "unlock"), ("show", "hide"), ("block", "allow"),
    ("hottest", "coldest"), ("warmest", "coldest"), ("warm", "cold"), ("highest", "lowest"),
    ("biggest", "smallest"), ("richest", "poorest"), ("closest", "farthest"), ("nearest", "farthest"),
]
_OPPOSITE_OF: dict[str, set[str]] = {}
for _a, _b in _OPPOSITES:
    _OPPOSITE_OF.setdefault(_a, set()).add(_b)
    _OPPOSITE_OF.setdefault(_b, set()).add(_a)
del _a, _b

_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "dozen": 12, "hundred": 100,
    "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12,
    "twice": 2, "half": 0.5,
}
# Units of measure that "a"/"an" counts as one of ("cups in a gallon" = "in one gallon").
_MEASURES = frozenset({"gal", "mile", "km", "m", "lb", "kg", "l", "cup", "inch", "ft", "oz", "tbsp", "tsp", "g"})
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SCALE_SUFFIX = {"k": 1000, "m": 10**6, "b": 10**9, "bn": 10**9}
# Units attached to a number; spelled-out forms are mapped to one canonical name.
_UNITS = {
    "%": "%", "percent": "%", "per": None, "km": "km", "kilometers": "km", "kilometres": "km",
    "kilometer": "km", "m": "m", "meters": "m", "metres": "m", "meter": "m", "cm": "cm",
    "mm": "mm", "mi": "mile", "mile": "mile", "miles": "mile", "ft": "ft", "feet": "ft",
    "foot": "ft", "in": None, "inch": "inch", "inches": "inch", "kg": "kg", "kilograms": "kg",
    "g": "g", "grams": "g", "lb": "lb", "lbs": "lb", "pounds": "lb", "oz": "oz", "ounces": "oz",
    "l": "l", "liters": "l", "litres": "l", "ml": "ml", "gallons": "gal", "gallon": "gal",
    "c": "degC", "°c": "degC", "celsius": "degC", "f": "degF", "°f": "degF", "fahrenheit": "degF",
    "k": None, "kelvin": "K", "s": "s", "sec": "s", "seconds": "s", "second": "s", "ms": "ms",
    "min": "min", "minutes": "min", "minute": "min", "h": "h", "hr": "h", "hours": "h",
    "hour": "h", "days": "day", "day": "day", "weeks": "week", "week": "week", "months": "month",
    "month": "month", "years": "year", "year": "year", "kb": "KB", "mb": "MB", "gb": "GB",
    "tb": "TB", "kib": "KiB", "mib": "MiB", "gib": "GiB", "usd": "USD", "$": "USD",
    "dollars": "USD", "eur": "EUR", "€": "EUR", "euros": "EUR", "£": "GBP", "gbp": "GBP",
    "mph": "mph", "kmh": "km/h", "km/h": "km/h", "w": "W", "watts": "W", "kw": "kW",
    "kwh": "kWh", "v": "V", "volts": "V", "hz": "Hz", "ghz": "GHz", "mhz": "MHz", "am": "am",
    "pm": "pm", "x": "x", "times": "x", "people": None, "words": "word", "word": "word",
    "lines": "line", "line": "line", "sentences": "sentence", "paragraphs": "paragraph",
    "items": None, "tokens": "token", "bits": "bit", "bytes": "byte", "calories": "kcal",
    "kcal": "kcal", "servings": "serving", "cups": "cup", "cup": "cup", "tbsp": "tbsp",
    "tsp": "tsp", "pixels": "px", "px": "px", "dpi": "dpi", "fps": "fps", "rpm": "rpm",
}

# Words that start a sentence in a prompt without being names. A capitalised word at a
# sentence start counts as a (weak) entity only when it is not one of these.
_COMMON = frozenset("""
a an the this that these those it its i me my we our you your he she they them their his her
what which who whom whose when where why how whether is are was were be been being am do does did
can could should would will shall may might must have has had if then else so but and or
as at by for from in into of on onto to with about after before during since until while
please write explain describe give tell list show help summarize summarise compare create make
draft compose generate translate convert calculate compute find suggest recommend provide share
outline define name identify rewrite rephrase fix debug implement build design plan imagine
suppose assume consider let lets let's any some all each every there here also just only
yes no not okay ok hi hello hey thanks thank could would quick short brief simple
is isn't are aren't does doesn't do don't can can't will won't should shouldn't
why's what's how's where's who's i'm i've i'd i'll also now today tomorrow yesterday
one two three four five six seven eight nine ten first second third next finally then
step steps use using answer question say check turn put keep get set go see look take try
choose pick rank sort count estimate evaluate analyze analyse review critique proofread edit
solve prove derive simplify factor expand classify predict discuss argue teach walk best
""".split())

_WORD = re.compile(
    r"[$€£]?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:st|nd|rd|th)?%?|°[cfCF]|[A-Za-z][\w'\-./]*[\w]|[A-Za-z]|[%$€£]"
)
_QUOTED = re.compile(r"\"([^\"]{1,200})\"|“([^”]{1,200})”|`([^`]{1,200})`|(?<![\w])'([^']{1,200})'(?![\w])")
_SENTENCE_END = re.compile(r"[.!?:;]\s*$|^\s*$|[\n]\s*[-*\d.)]*\s*$")
_NUM = re.compile(r"^[$€£]?(\d[\d,]*(?:\.\d+)?)(?:/(\d+))?(st|nd|rd|th)?(%)?$")


@dataclass(slots=True, frozen=True)
class RiskFlag:
    """One reason a neighbour may need a different answer, with the words that triggered it."""

    kind: str  # negation | number | entity
    words: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {', '.join(self.words)}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": list(self.words), "detail": self.detail}


@dataclass(slots=True)
class _Parsed:
    text: str
    tokens: list[str]  # lowercased word tokens, "n't" expanded to "not"
    starts: list[bool]  # True when the token opens a sentence
    raw: list[str]  # tokens as written
    quoted: list[str]


def _tokenize(text: str) -> _Parsed:
    tokens: list[str] = []
    raw: list[str] = []
    starts: list[bool] = []
    for m in _WORD.finditer(text):
        word = m.group(0).strip("'.-/")
        if not word:
            continue
        start = bool(_SENTENCE_END.search(text[: m.start()]))
        # A word right after an opening quote or bracket still starts the sentence.
        if not start and m.start() > 0 and text[m.start() - 1] in "\"'“(`[":
            start = bool(_SENTENCE_END.search(text[: m.start() - 1]))
        low = word.lower()
        if low in _CONTRACTIONS:
            parts = _CONTRACTIONS[low].split()
        elif low.endswith("n't"):
            parts = [low[:-3], "not"]
        else:
            parts = [low]
        raws = [word] * len(parts)
        if len(parts) == 1 and "-" in word and any(
                w[:1].isdigit() or w.lower() in _NUMBER_WORDS or w.lower() == "non" for w in word.split("-")):
            # "three-sentence", "GPT-4", "non-toxic": the number or negation is a word of its own.
            raws = [w for w in word.split("-") if w]
            parts = [w.lower() for w in raws]
        for i, (part, rw) in enumerate(zip(parts, raws)):
            tokens.append(part)
            raw.append(rw)
            starts.append(start and i == 0)
    quoted = [next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(text)]
    return _Parsed(text, tokens, starts, raw, [q for q in quoted if q])


def _stem(word: str) -> str:
    """A crude stem, enough to match "increases", "increased" and "increase"."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


# --- negation --------------------------------------------------------------------------

def _negation_flag(a: _Parsed, b: _Parsed) -> RiskFlag | None:
    neg_a = Counter(t for t in a.tokens if t in _NEGATORS)
    neg_b = Counter(t for t in b.tokens if t in _NEGATORS)
    words: list[str] = []
    if sum(neg_a.values()) != sum(neg_b.values()):
        words += sorted(((neg_a - neg_b) + (neg_b - neg_a)).keys())
    only_a = set(a.tokens) - set(b.tokens)
    only_b = set(b.tokens) - set(a.tokens)
    for x in sorted(only_a):
        for y in sorted(only_b):
            if _is_negated_form(x, y) or _is_negated_form(y, x) or _are_opposites(x, y):
                words += [x, y]
    # Multi-word opposites such as "cheapest" / "most expensive".
    text_a, text_b = " ".join(a.tokens), " ".join(b.tokens)
    for x, ys in _OPPOSITE_OF.items():
        if " " not in x and not any(" " in y for y in ys):
            continue
        for y in ys:
            if _has_phrase(text_a, x) and _has_phrase(text_b, y) and not _has_phrase(text_b, x):
                words += [x, y]
    if not words:
        return None
    words = list(dict.fromkeys(words))
    return RiskFlag("negation", tuple(words), "negation or an opposite word appears in only one prompt")


def _has_phrase(text: str, phrase: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(phrase)}(?![\w])", text) is not None


def _is_negated_form(word: str, other: str) -> bool:
    """True when `other` is `word` with a negative prefix, e.g. safe -> unsafe."""
    if len(word) < 3:
        return False
    # The one- and two-letter prefixes only on longer words: "abnormal", not "abuse".
    return any(other == p + word for p in _NEGATIVE_PREFIXES if len(p) > 2 or p in ("un", "in", "im", "il", "ir") or len(word) >= 5)


def _are_opposites(x: str, y: str) -> bool:
    if y in _OPPOSITE_OF.get(x, ()):
        return True
    # Inflected forms: "increases" / "decreased".
    sx, sy = _stem(x), _stem(y)
    return any(_stem(o) == sy for base, opposites in _OPPOSITE_OF.items() if _stem(base) == sx for o in opposites)


# --- numbers ---------------------------------------------------------------------------

def _numbers(p: _Parsed) -> list[tuple[str, str, str]]:
    """(canonical value, canonical unit, surface text) for each number in the prompt."""
    out: list[tuple[str, str, str]] = []
    toks, raw = p.tokens, p.raw
    i = 0
    while i < len(toks):
        tok = toks[i]
        value: float | None = None
        surface = [raw[i]]
        unit = ""
        j = i + 1
        m = _NUM.match(tok)
        if m:
            value = float(m.group(1).replace(",", ""))
            if m.group(2):
                value = value / float(m.group(2)) if float(m.group(2)) else value
            if m.group(4):
                unit = "%"
            if tok[0] in "$€£":
                unit = _UNITS[tok[0]]
        elif re.fullmatch(r"\d+(?:\.\d+)?[a-z°/]+", tok):
            # "5km", "16gb", "3pm", "10k": a number glued to its unit or scale.
            num, suffix = re.match(r"(\d+(?:\.\d+)?)(.*)", tok).groups()
            value = float(num)
            if suffix in _SCALE_SUFFIX:
                value *= _SCALE_SUFFIX[suffix]
            elif suffix in _UNITS and _UNITS[suffix]:
                unit = _UNITS[suffix]
            else:
                unit = suffix
        elif tok in ("a", "an") and j < len(toks) and _unit_of(toks[j]) in _MEASURES:
            value = 1.0  # "a gallon" says "one gallon"
        elif tok in _NUMBER_WORDS and not (tok == "one" and not _counts_next(toks, j)):
            value = float(_NUMBER_WORDS[tok])
            # "twenty five", "three hundred".
            while j < len(toks) and toks[j] in _NUMBER_WORDS and toks[j] not in ("half", "twice", "one"):
                nxt = _NUMBER_WORDS[toks[j]]
                value = value * nxt if toks[j] in _SCALES else value + nxt
                surface.append(raw[j])
                j += 1
        if value is None:
            i += 1
            continue
        if not unit and j < len(toks) and toks[j] in _SCALES:
            value *= _SCALES[toks[j]]
            surface.append(raw[j])
            j += 1
        if not unit and j < len(toks):
            nxt = toks[j]
            canonical = _unit_of(nxt)
            if canonical:
                unit = canonical
                surface.append(raw[j])
                j += 1
        if not unit and i > 0 and toks[i - 1] in ("$", "€", "£"):
            unit = _UNITS[toks[i - 1]]
        out.append((f"{value:g}", unit, " ".join(surface)))
        i = j
    return out


def _unit_of(word: str) -> str:
    for form in (word, word + "s", word[:-1] if word.endswith("s") else word):
        if _UNITS.get(form):
            return _UNITS[form]
    return ""


def _counts_next(toks: list[str], j: int) -> bool:
    """'one' is a number before a noun it counts ('one paragraph'), not in 'one of' or 'which one'."""
    return j < len(toks) and toks[j] not in _COMMON and toks[j] not in ("way", "another", "thing")


def _number_flag(a: _Parsed, b: _Parsed) -> RiskFlag | None:
    na, nb = _numbers(a), _numbers(b)
    ca = Counter((v, u) for v, u, _ in na)
    cb = Counter((v, u) for v, u, _ in nb)
    if ca == cb:
        return None
    diff_a, diff_b = ca - cb, cb - ca
    words = [s for v, u, s in na if (v, u) in diff_a] + [s for v, u, s in nb if (v, u) in diff_b]
    return RiskFlag("number", tuple(dict.fromkeys(words)), "numbers or units differ between the prompts")


# --- entities and quoted values ---------------------------------------------------------

def _entities(p: _Parsed) -> list[tuple[str, bool]]:
    """(entity text, strong?) candidates. Strong: capitalised mid-sentence, an acronym, a
    code-like or alphanumeric name. Weak: a capitalised uncommon word opening a sentence."""
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(p.raw):
        word = p.raw[i]
        tok = p.tokens[i]
        strong = False
        is_cap = word[:1].isupper()
        if re.search(r"[a-z][A-Z]|[A-Za-z]\d|\d[A-Za-z]{2,}|[a-z]_[a-z]|\w\.\w|\w\(", word) and not _NUM.match(tok):
            strong = not re.fullmatch(r"\d+(?:\.\d+)?[a-z%°/]+", tok)  # "5km" is a number, not a name
        elif len(word) >= 2 and word.isupper() and word.isalpha():
            strong = True
        elif is_cap and word != "I" and tok not in _COMMON and not p.starts[i]:
            strong = True
        elif not (is_cap and p.starts[i] and tok not in _COMMON and word.isalpha()):
            i += 1
            continue
        # Join a run of capitalised words into one name ("New York", "Visual Studio Code").
        j = i + 1
        parts = [word]
        while j < len(p.raw) and p.raw[j][:1].isupper() and p.tokens[j] not in _COMMON and not p.starts[j]:
            parts.append(p.raw[j])
            j += 1
        out.append((" ".join(parts), strong or len(parts) > 1))
        i = j
    return out


def _norm_word(word: str) -> str:
    word = word.lower()
    if word.endswith("'s"):
        word = word[:-2]
    return word


def _present(entity: str, other: _Parsed) -> bool:
    words = {_norm_word(w) for w in other.raw} | set(other.tokens)
    stems = {_stem(w) for w in words}
    return all(_norm_word(part) in words or _stem(_norm_word(part)) in stems for part in entity.split())


def _quoted_present(value: str, other: _Parsed) -> bool:
    norm = lambda s: re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", s.lower())).strip()  # noqa: E731
    return norm(value) in norm(other.text)


def _entity_flag(a: _Parsed, b: _Parsed) -> RiskFlag | None:
    words: list[str] = []
    for q in a.quoted:
        if not _quoted_present(q, b):
            words.append(f'"{q}"')
    for q in b.quoted:
        if not _quoted_present(q, a):
            words.append(f'"{q}"')
    missing_a = [(e, s) for e, s in _entities(a) if not _present(e, b)]
    missing_b = [(e, s) for e, s in _entities(b) if not _present(e, a)]
    # A strong name on one side only is flagged; a weak one (sentence start) only when the
    # other prompt also has a name of its own, i.e. one name was swapped for another.
    swapped = bool(missing_a) and bool(missing_b)
    for e, strong in missing_a + missing_b:
        if strong or swapped:
            words.append(e)
    if not words:
        return None
    return RiskFlag("entity", tuple(dict.fromkeys(words)), "quoted values or names differ between the prompts")


def risk_flags(query: str, candidate: str) -> list[RiskFlag]:
    """The flags raised by serving `candidate`'s answer to `query`, in FLAG_KINDS order."""
    if not isinstance(query, str) or not isinstance(candidate, str):
        raise ValueError("risk flags compare two prompt strings")
    a, b = _tokenize(query), _tokenize(candidate)
    flags = [_negation_flag(a, b), _number_flag(a, b), _entity_flag(a, b)]
    return [f for f in flags if f is not None]

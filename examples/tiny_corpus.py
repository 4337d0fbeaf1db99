"""Synthetic multi-domain chat corpus for the bundled tiny models, and the built-in prompt set.

Everything is generated from templates with a seeded RNG, so the corpus, the tokenizer trained on it and
the prompts are the same on every machine. The domains mirror the built-in acceptance prompt set: code,
math, RAG-style extraction, a second language (French), chat, summarisation and structured output.
"""

from __future__ import annotations

import json
import random

NAMES = [
    "Alice",
    "Bob",
    "Carol",
    "David",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jonas",
    "Kenji",
    "Laura",
    "Marco",
    "Nora",
    "Omar",
    "Paula",
    "Quinn",
    "Rosa",
    "Samir",
    "Tara",
]
CITIES = [
    "Paris",
    "Rome",
    "Berlin",
    "Madrid",
    "Lisbon",
    "Vienna",
    "Prague",
    "Oslo",
    "Dublin",
    "Athens",
    "Warsaw",
    "Zurich",
    "Lyon",
    "Porto",
    "Milan",
]
JOBS = ["doctor", "teacher", "engineer", "pilot", "baker", "lawyer", "nurse", "farmer", "writer", "chef"]
COLORS = ["red", "blue", "green", "black", "white", "yellow"]
FRUITS = ["apples", "pears", "oranges", "lemons", "plums", "grapes"]
COUNTRIES = {
    "France": "Paris",
    "Italy": "Rome",
    "Germany": "Berlin",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Norway": "Oslo",
    "Ireland": "Dublin",
    "Greece": "Athens",
    "Poland": "Warsaw",
}

# English -> French word table for the translation domain (articles chosen per noun gender).
FR_NOUNS = {
    "cat": ("le", "chat"),
    "dog": ("le", "chien"),
    "house": ("la", "maison"),
    "car": ("la", "voiture"),
    "book": ("le", "livre"),
    "table": ("la", "table"),
    "garden": ("le", "jardin"),
    "city": ("la", "ville"),
    "bread": ("le", "pain"),
    "door": ("la", "porte"),
}
FR_ADJ = {"big": "grand", "small": "petit", "red": "rouge", "black": "noir", "new": "nouveau", "old": "vieux"}
FR_ADJ_F = {"big": "grande", "small": "petite", "red": "rouge", "black": "noire", "new": "nouvelle", "old": "vieille"}
FR_PLACES = {
    "on the table": "sur la table",
    "in the garden": "dans le jardin",
    "in the house": "dans la maison",
    "near the door": "près de la porte",
    "in the city": "dans la ville",
}

CODE_TASKS = [
    (
        "returns the sum of a list of numbers",
        "sum_list",
        "items",
        ["total = 0", "for item in items:", "    total += item", "return total"],
    ),
    (
        "returns the largest number in a list",
        "max_value",
        "items",
        ["best = items[0]", "for item in items:", "    if item > best:", "        best = item", "return best"],
    ),
    (
        "returns the smallest number in a list",
        "min_value",
        "items",
        ["best = items[0]", "for item in items:", "    if item < best:", "        best = item", "return best"],
    ),
    (
        "counts the even numbers in a list",
        "count_even",
        "items",
        ["count = 0", "for item in items:", "    if item % 2 == 0:", "        count += 1", "return count"],
    ),
    ("reverses a string", "reverse_text", "text", ["return text[::-1]"]),
    (
        "returns the average of a list of numbers",
        "average",
        "items",
        ["if not items:", "    return 0.0", "return sum(items) / len(items)"],
    ),
    (
        "checks whether a number is prime",
        "is_prime",
        "n",
        [
            "if n < 2:",
            "    return False",
            "for d in range(2, int(n ** 0.5) + 1):",
            "    if n % d == 0:",
            "        return False",
            "return True",
        ],
    ),
    (
        "returns the factorial of n",
        "factorial",
        "n",
        ["result = 1", "for k in range(2, n + 1):", "    result *= k", "return result"],
    ),
    ("counts the words in a sentence", "count_words", "text", ["return len(text.split())"]),
    ("returns the squares of a list of numbers", "squares", "items", ["return [item * item for item in items]"]),
]

SUMMARY_EVENTS = [
    (
        "The city council met on {day}.",
        "They discussed the new {thing}.",
        "The {thing} will open in {month}.",
        "Many people were happy about it.",
        "The council discussed the new {thing}, which opens in {month}.",
    ),
    (
        "{name} started a new job as a {job} on {day}.",
        "The work is in {city}.",
        "{name} moves there in {month}.",
        "Friends plan a small party.",
        "{name} becomes a {job} in {city} and moves there in {month}.",
    ),
    (
        "A storm hit {city} on {day}.",
        "Several trees fell in the {thing}.",
        "Workers cleaned the streets.",
        "The {thing} opens again in {month}.",
        "A storm hit {city}; the {thing} reopens in {month}.",
    ),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["March", "April", "May", "June", "July", "September", "October"]
THINGS = ["park", "library", "museum", "bridge", "market", "school"]


def _math(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
    if kind == 0:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}. The answer is {a + b}."
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", f"{a} - {b} = {a - b}. The answer is {a - b}."
    if kind == 2:
        return f"What is {b} * {c}?", f"{b} * {c} = {b * c}. The answer is {b * c}."
    return (
        f"Compute {b} * {c} + {a}.",
        f"First, {b} * {c} = {b * c}. Then, {b * c} + {a} = {b * c + a}. The answer is {b * c + a}.",
    )


def _code(rng: random.Random) -> tuple[str, str]:
    what, fname, arg, body = rng.choice(CODE_TASKS)
    lang = rng.choice(["Python function", "Python function", "small Python function"])
    code = "\n".join([f"def {fname}({arg}):"] + ["    " + line for line in body])
    return f"Write a {lang} that {what}.", f"```python\n{code}\n```"


def _rag(rng: random.Random) -> tuple[str, str]:
    people = rng.sample(NAMES, 3)
    facts = [(p, rng.choice(CITIES), rng.choice(JOBS)) for p in people]
    ctx = " ".join(f"{p} lives in {c} and works as a {j}." for p, c, j in facts)
    p, c, j = rng.choice(facts)
    if rng.random() < 0.5:
        return f"Context: {ctx}\nQuestion: Where does {p} live?", f"{p} lives in {c}."
    return f"Context: {ctx}\nQuestion: What is the job of {p}?", f"{p} works as a {j}."


def _french(rng: random.Random) -> tuple[str, str]:
    noun = rng.choice(list(FR_NOUNS))
    adj = rng.choice(list(FR_ADJ))
    place = rng.choice(list(FR_PLACES))
    art, fr_noun = FR_NOUNS[noun]
    fr_adj = FR_ADJ_F[adj] if art == "la" else FR_ADJ[adj]
    before = adj in ("big", "small", "new", "old")
    phrase = f"{art} {fr_adj} {fr_noun}" if before else f"{art} {fr_noun} {fr_adj}"
    phrase = phrase[0].upper() + phrase[1:]
    return (f"Translate to French: the {adj} {noun} is {place}.", f"{phrase} est {FR_PLACES[place]}.")


def _chat(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        country = rng.choice(list(COUNTRIES))
        return f"What is the capital of {country}?", f"The capital of {country} is {COUNTRIES[country]}."
    if kind == 1:
        name = rng.choice(NAMES)
        return (f"Hello, my name is {name}.", f"Hello {name}, nice to meet you. How can I help you today?")
    if kind == 2:
        return ("Who are you?", "I am a small assistant. I can help with math, code, short questions and French.")
    color, fruit = rng.choice(COLORS), rng.choice(FRUITS)
    return (
        f"Do you like {color} {fruit}?",
        f"I do not eat, but many people like {color} {fruit}. They are good in a salad.",
    )


def _summary(rng: random.Random) -> tuple[str, str]:
    s1, s2, s3, s4, summ = rng.choice(SUMMARY_EVENTS)
    f = dict(
        day=rng.choice(DAYS),
        month=rng.choice(MONTHS),
        thing=rng.choice(THINGS),
        name=rng.choice(NAMES),
        job=rng.choice(JOBS),
        city=rng.choice(CITIES),
    )
    text = " ".join(s.format(**f) for s in (s1, s2, s3, s4))
    return f"Summarize in one sentence: {text}", f"Summary: {summ.format(**f)}"


def _json(rng: random.Random) -> tuple[str, str]:
    name, city, age = rng.choice(NAMES), rng.choice(CITIES), rng.randint(18, 80)
    if rng.random() < 0.5:
        return (
            f"Give a JSON object for a person named {name}, age {age}, from {city}.",
            json.dumps({"name": name, "age": age, "city": city}),
        )
    job = rng.choice(JOBS)
    return (
        f"Return JSON with the fields name and job for {name}, who works as a {job}.",
        json.dumps({"name": name, "job": job}),
    )


DOMAINS = {
    "math": _math,
    "coding": _code,
    "rag": _rag,
    "multilingual": _french,
    "chat": _chat,
    "summarization": _summary,
    "structured": _json,
}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """Python twin of CHAT_TEMPLATE, used before a tokenizer exists."""
    out = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
    return out + ("<|assistant|>\n" if add_generation_prompt else "")


def example(rng: random.Random, domain: str | None = None) -> tuple[str, str, str]:
    """One (domain, user, assistant) turn."""
    domain = domain or rng.choice(list(DOMAINS))
    user, assistant = DOMAINS[domain](rng)
    return domain, user, assistant


def corpus(n: int, seed: int) -> list[str]:
    """n chat-formatted documents, most with one turn, some with two."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        turns = 1 if rng.random() < 0.8 else 2
        msgs: list[dict[str, str]] = []
        for _ in range(turns):
            _, u, a = example(rng)
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        docs.append(render_chat(msgs))
    return docs


def prompt_set(per_domain: int, seed: int) -> list[dict]:
    """Held-out prompts (a different seed from training) as JSONL records: messages + domain."""
    rng = random.Random(seed)
    records = []
    for domain in DOMAINS:
        for i in range(per_domain):
            _, user, _ = example(rng, domain)
            records.append({"id": f"{domain}-{i}", "domain": domain, "messages": [{"role": "user", "content": user}]})
    return records

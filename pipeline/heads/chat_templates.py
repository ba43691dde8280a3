"""Templated training-only chat instructions (``chat_train_more.jsonl``), written for this project.

Task templates x topics, plus arithmetic word problems and rewrite tasks with numbers / sentences
drawn from a seeded generator, so the list is varied and deterministic. Training only: prompts that
equal a held-out prompt are dropped by :func:`pipeline.heads.prompts.build_extra_prompt_sets`.
"""

from __future__ import annotations

import hashlib
import random


def stable_rank(text: str) -> str:
    """A sort key that shuffles deterministically (same order on every machine and Python)."""
    return hashlib.sha256(text.encode()).hexdigest()


TOPICS = (
    "photosynthesis",
    "volcanoes",
    "the water cycle",
    "black holes",
    "earthquakes",
    "the immune system",
    "electric cars",
    "solar panels",
    "wind turbines",
    "recycling",
    "climate change",
    "coral reefs",
    "honey bees",
    "the moon",
    "rainbows",
    "tides",
    "the human heart",
    "sleep",
    "vitamins",
    "exercise",
    "meditation",
    "time management",
    "public speaking",
    "learning a new language",
    "saving money",
    "budgeting",
    "credit cards",
    "inflation",
    "the stock market",
    "small businesses",
    "remote work",
    "job interviews",
    "writing a resume",
    "teamwork",
    "leadership",
    "negotiation",
    "email etiquette",
    "cloud computing",
    "machine learning",
    "passwords",
    "encryption",
    "the internet",
    "web browsers",
    "smartphones",
    "video games",
    "social media",
    "version control with git",
    "unit testing",
    "recursion",
    "sorting algorithms",
    "binary numbers",
    "spreadsheets",
    "operating systems",
    "computer viruses",
    "3D printing",
    "robots",
    "space exploration",
    "the Roman Empire",
    "the printing press",
    "the Industrial Revolution",
    "ancient Egypt",
    "the Olympic Games",
    "chess",
    "jazz music",
    "painting with watercolors",
    "photography",
    "gardening",
    "composting",
    "baking bread",
    "making coffee",
    "healthy breakfasts",
    "vegetarian cooking",
    "camping",
    "hiking",
    "cycling",
    "running a marathon",
    "swimming",
    "dogs as pets",
    "cats as pets",
    "houseplants",
    "moving to a new city",
    "traveling on a budget",
    "museums",
    "libraries",
    "reading habits",
    "poetry",
    "friendship",
    "volunteering",
    "birthdays",
    "weddings",
    "board games",
    "rain forests",
    "deserts",
    "oceans",
    "mountains",
    "bridges",
    "airplanes",
    "trains",
    "electricity",
    "magnets",
    "batteries",
    "clocks",
)

TASKS = (
    "Explain {t} in simple terms.",
    "Explain {t} to a ten-year-old.",
    "What are the main benefits of {t}?",
    "What are some common misconceptions about {t}?",
    "Give me three interesting facts about {t}.",
    "List five key words related to {t} and define each one.",
    "Write a short paragraph about {t}.",
    "Write a haiku about {t}.",
    "Write a four-line poem about {t}.",
    "Write a tweet about {t}.",
    "Write a short story opening that involves {t}.",
    "Summarize the most important ideas about {t} in three bullet points.",
    "What is the history of {t}, in brief?",
    "How would you teach a beginner about {t}?",
    "What questions would a student ask about {t}? List four.",
    "Describe {t} in two sentences.",
    "What are the pros and cons of {t}?",
    "Give me a step-by-step guide to getting started with {t}.",
    "Write a short quiz with three questions about {t}.",
    "Why do people care about {t}?",
    "Suggest a title for a blog post about {t}.",
    "Write an outline for a short presentation about {t}.",
    "What are two myths and two facts about {t}?",
    "How does {t} affect everyday life?",
    "Compare {t} with {u}.",
    "What do {t} and {u} have in common?",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "Give me a fun analogy that explains {t}.",
    "What are some good tips related to {t}?",
    "Write a product description for a book about {t}.",
)

SENTENCES = (
    "The report that was written by the team last week contains several mistakes that need to be fixed.",
    "Due to the fact that it was raining, we decided to stay inside and watch a movie instead.",
    "In my opinion, I think that the new park is a really very nice place for families to visit.",
    "the store is closed on sundays but open every other day from nine to five",
    "She don't like going to the gym in the morning because she are tired.",
    "Our company is pleased to announce that we will be opening a new office in the spring of next year.",
    "At this point in time, we are not able to offer a refund for items that have been opened.",
    "The cat sat on the mat and looked out of the window at the birds in the garden.",
    "Please make sure that you remember to bring your laptop and charger to the meeting tomorrow.",
    "It is very important that all employees wash their hands before returning to work.",
    "I am writing to let you know that your order has been shipped and should arrive soon.",
    "The movie was long, but the ending was surprising and the music was beautiful.",
)

REWRITES = (
    "Rewrite this sentence to be more formal: {s}",
    "Rewrite this sentence to be more casual: {s}",
    "Make this sentence shorter: {s}",
    "Fix the grammar in this sentence: {s}",
    "Translate this sentence into French: {s}",
    "Rewrite this sentence in the passive voice: {s}",
    "Summarize this sentence in five words: {s}",
)

ITEMS = ("apples", "pencils", "books", "cookies", "marbles", "stickers", "oranges", "tickets", "coins", "cards")
NAMES = ("Anna", "Ben", "Carlos", "Dana", "Eli", "Fatima", "George", "Hana", "Ivan", "Julia", "Kenji", "Lena")


def _word_problems(rng: random.Random, count: int) -> list[str]:
    out = []
    for _ in range(count):
        a, b, c = rng.randint(3, 60), rng.randint(2, 30), rng.randint(2, 9)
        n1, n2 = rng.sample(NAMES, 2)
        item = rng.choice(ITEMS)
        out.append(
            rng.choice(
                (
                    f"{n1} has {a} {item} and buys {b} more. How many {item} does {n1} have now?",
                    f"{n1} has {a + b} {item} and gives {b} to {n2}. How many are left?",
                    f"A box holds {c} {item}. How many {item} are in {b} boxes?",
                    f"{n1} shares {a * c} {item} equally among {c} friends. How many does each friend get?",
                    f"A train travels {a} kilometers per hour for {c} hours. How far does it go?",
                    f"A shirt costs {a} dollars and is on sale for {b} percent off. What is the sale price?",
                    f"What is {a} times {b}?",
                    f"What is {a * b} divided by {b}?",
                    f"What is {a} percent of {b * 10}?",
                    f"A rectangle is {a} centimeters long and {b} centimeters wide. What is its perimeter?",
                    f"{n1} is {a} years old and {n2} is {b} years older. How old is {n2}?",
                    f"If {c} notebooks cost {c * b} dollars, how much does one notebook cost?",
                    f"Convert {a} hours into minutes.",
                    f"What is the average of {a}, {b} and {c}?",
                )
            )
        )
    return out


def templated_chat_prompts(
    per_topic: int = 5, problems: int = 120, rewrites: int = 60, seed: int = 0
) -> list[tuple[str, str]]:
    """(category, prompt) pairs, deterministic, without duplicates."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for i, topic in enumerate(TOPICS):
        other = TOPICS[(i * 7 + 3) % len(TOPICS)]
        chosen = sorted(TASKS, key=lambda task: stable_rank(topic + "|" + task))[:per_topic]
        out.extend(("templated", task.format(t=topic, u=other)) for task in chosen)
    out.extend(("math word problems", p) for p in _word_problems(rng, problems))
    pairs = [(r, s) for r in REWRITES for s in SENTENCES]
    pairs.sort(key=lambda p: stable_rank(p[0] + p[1]))
    out.extend(("rewrites", r.format(s=s)) for r, s in pairs[:rewrites])
    seen, unique = set(), []
    for category, prompt in out:
        if prompt not in seen:
            seen.add(prompt)
            unique.append((category, prompt))
    return unique

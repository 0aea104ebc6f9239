"""A small deterministic synthetic English→German corpus: the demo's default data.

    python -m train.agent.data.synthetic OUT_DIR [--train 20000] [--valid 500] [--test 500] [--seed 1]

writes OUT_DIR/{train,valid,test}.{en,de}, one sentence per line, and prints the sizes.

The text comes from a toy grammar over a hand-written lexicon (112 nouns with gender and
plural, 46 adjectives, 57 verbs, adverbs, numbers, days: ≈500 English word types),
generated here and copied from nowhere. It carries the things a translation model has to
learn about German, so BLEU rises step by step rather than jumping:

- word choice (a few hundred content words) and noun capitalisation;
- case and gender agreement: der/die/das, den/dem, ein/eine/einen/einem, and the
  adjective endings that go with them (der große Hund, einen großen Hund, ein großes Haus);
- verb-second word order after a fronted adverb (Heute sieht der Hund ...);
- verb-final subordinate clauses (..., dass der Hund die Katze sieht.), and the inverted
  main clause after a fronted subordinate clause (Weil ..., lacht die Katze.);
- the perfect with its participle at the end (hat ... gesehen / ist ... gelaufen);
- negation and frequency adverbs after the verb, dative verbs (hilft dem Mann),
  preposition + article contractions (im, am, beim, vom, zum, zur).

Same seed, same corpus, byte for byte; valid and test sentences never occur in train.
The defaults (20k/500/500) are 0.9 MB English + 1.0 MB German; with a 1000-piece joint
sentencepiece vocabulary the `tiny` preset on two CPU processes goes from BLEU 0 (untrained)
to ≈50 after 200 updates and ≈74 after 300 (≈3 min on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

# --- the lexicon ---------------------------------------------------------------------------

# english | english plural ("-" = regular) | german | gender m/f/n | german plural
_NOUNS = """
dog - Hund m Hunde
cat - Katze f Katzen
man men Mann m Männer
woman women Frau f Frauen
child children Kind n Kinder
teacher - Lehrer m Lehrer
pupil - Schüler m Schüler
doctor - Arzt m Ärzte
bird - Vogel m Vögel
horse - Pferd n Pferde
cow - Kuh f Kühe
mouse mice Maus f Mäuse
fish fish Fisch m Fische
house - Haus n Häuser
car - Auto n Autos
book - Buch n Bücher
table - Tisch m Tische
chair - Stuhl m Stühle
door - Tür f Türen
window - Fenster n Fenster
garden - Garten m Gärten
city - Stadt f Städte
village - Dorf n Dörfer
street - Straße f Straßen
tree - Baum m Bäume
flower - Blume f Blumen
apple - Apfel m Äpfel
bread - Brot n Brote
letter - Brief m Briefe
picture - Bild n Bilder
song - Lied n Lieder
friend - Freund m Freunde
girl - Mädchen n Mädchen
brother - Bruder m Brüder
sister - Schwester f Schwestern
father - Vater m Väter
mother - Mutter f Mütter
king - König m Könige
queen - Königin f Königinnen
cook - Koch m Köche
baker - Bäcker m Bäcker
painter - Maler m Maler
singer - Sänger m Sänger
boat - Boot n Boote
ship - Schiff n Schiffe
train - Zug m Züge
bicycle - Fahrrad n Fahrräder
ball - Ball m Bälle
key - Schlüssel m Schlüssel
cup - Tasse f Tassen
glass - Glas n Gläser
bottle - Flasche f Flaschen
box - Kiste f Kisten
bag - Tasche f Taschen
lamp - Lampe f Lampen
clock - Uhr f Uhren
bed - Bett n Betten
room - Zimmer n Zimmer
kitchen - Küche f Küchen
school - Schule f Schulen
church - Kirche f Kirchen
bridge - Brücke f Brücken
river - Fluss m Flüsse
mountain - Berg m Berge
lake - See m Seen
forest - Wald m Wälder
field - Feld n Felder
stone - Stein m Steine
hat - Hut m Hüte
shoe - Schuh m Schuhe
coat - Mantel m Mäntel
shirt - Hemd n Hemden
dress - Kleid n Kleider
computer - Computer m Computer
phone - Telefon n Telefone
pen - Stift m Stifte
newspaper - Zeitung f Zeitungen
story - Geschichte f Geschichten
question - Frage f Fragen
answer - Antwort f Antworten
idea - Idee f Ideen
plan - Plan m Pläne
cake - Kuchen m Kuchen
egg - Ei n Eier
cheese - Käse m Käse
soup - Suppe f Suppen
pig - Schwein n Schweine
sheep sheep Schaf n Schafe
goat - Ziege f Ziegen
duck - Ente f Enten
wolf wolves Wolf m Wölfe
fox - Fuchs m Füchse
rabbit - Kaninchen n Kaninchen
frog - Frosch m Frösche
snake - Schlange f Schlangen
spider - Spinne f Spinnen
bee - Biene f Bienen
guest - Gast m Gäste
nurse - Pflegerin f Pflegerinnen
waiter - Kellner m Kellner
uncle - Onkel m Onkel
aunt - Tante f Tanten
wall - Wand f Wände
roof - Dach n Dächer
park - Park m Parks
shop - Laden m Läden
market - Markt m Märkte
office - Büro n Büros
hotel - Hotel n Hotels
island - Insel f Inseln
beach - Strand m Strände
road - Weg m Wege
"""

# english | german stem (takes the endings)
_ADJECTIVES = """
big groß
small klein
old alt
young jung
red rot
blue blau
green grün
black schwarz
white weiß
yellow gelb
brown braun
fast schnell
slow langsam
beautiful schön
loud laut
quiet leise
new neu
clever klug
tired müde
happy glücklich
friendly freundlich
sad traurig
hungry hungrig
rich reich
poor arm
strong stark
weak schwach
long lang
short kurz
warm warm
cold kalt
hot heiß
clean sauber
dirty schmutzig
funny lustig
angry wütend
brave mutig
lazy faul
wild wild
cheap billig
heavy schwer
light leicht
empty leer
full voll
strange seltsam
famous berühmt
"""

# english 3sg | english plural | english participle | german 3sg | german plural |
# german participle | auxiliary (h = haben, s = sein) | object case (a/d; "-" intransitive)
# Multi-word English forms use "_" for the space.
_VERBS = """
sees see seen sieht sehen gesehen h a
finds find found findet finden gefunden h a
buys buy bought kauft kaufen gekauft h a
sells sell sold verkauft verkaufen verkauft h a
reads read read liest lesen gelesen h a
writes write written schreibt schreiben geschrieben h a
eats eat eaten isst essen gegessen h a
holds hold held hält halten gehalten h a
takes take taken nimmt nehmen genommen h a
brings bring brought bringt bringen gebracht h a
carries carry carried trägt tragen getragen h a
needs need needed braucht brauchen gebraucht h a
loves love loved liebt lieben geliebt h a
likes like liked mag mögen gemocht h a
hates hate hated hasst hassen gehasst h a
knows know known kennt kennen gekannt h a
paints paint painted malt malen gemalt h a
draws draw drawn zeichnet zeichnen gezeichnet h a
builds build built baut bauen gebaut h a
opens open opened öffnet öffnen geöffnet h a
closes close closed schließt schließen geschlossen h a
washes wash washed wäscht waschen gewaschen h a
cleans clean cleaned putzt putzen geputzt h a
visits visit visited besucht besuchen besucht h a
catches catch caught fängt fangen gefangen h a
hears hear heard hört hören gehört h a
feeds feed fed füttert füttern gefüttert h a
shows show shown zeigt zeigen gezeigt h a
forgets forget forgotten vergisst vergessen vergessen h a
throws throw thrown wirft werfen geworfen h a
pulls pull pulled zieht ziehen gezogen h a
counts count counted zählt zählen gezählt h a
meets meet met trifft treffen getroffen h a
loses lose lost verliert verlieren verloren h a
repairs repair repaired repariert reparieren repariert h a
orders order ordered bestellt bestellen bestellt h a
sends send sent schickt schicken geschickt h a
misses miss missed vermisst vermissen vermisst h a
understands understand understood versteht verstehen verstanden h a
describes describe described beschreibt beschreiben beschrieben h a
looks_for look_for looked_for sucht suchen gesucht h a
helps help helped hilft helfen geholfen h d
thanks thank thanked dankt danken gedankt h d
answers answer answered antwortet antworten geantwortet h d
sleeps sleep slept schläft schlafen geschlafen h -
laughs laugh laughed lacht lachen gelacht h -
waits wait waited wartet warten gewartet h -
works work worked arbeitet arbeiten gearbeitet h -
sings sing sung singt singen gesungen h -
dances dance danced tanzt tanzen getanzt h -
cries cry cried weint weinen geweint h -
plays play played spielt spielen gespielt h -
smiles smile smiled lächelt lächeln gelächelt h -
runs run run läuft laufen gelaufen s -
swims swim swum schwimmt schwimmen geschwommen s -
comes come come kommt kommen gekommen s -
jumps jump jumped springt springen gesprungen s -
"""

# verbs that introduce a "that" clause: english 3sg | english plural | german 3sg | german plural
_SAY_VERBS = """
says say sagt sagen
knows know weiß wissen
thinks think denkt denken
believes believe glaubt glauben
hopes hope hofft hoffen
hears hear hört hören
"""

# fronted adverbials (verb-second in German)
_TIME = """
today|heute
now|jetzt
in the morning|am Morgen
in the evening|am Abend
at night|in der Nacht
every day|jeden Tag
on monday|am Montag
on tuesday|am Dienstag
on wednesday|am Mittwoch
on thursday|am Donnerstag
on friday|am Freitag
on saturday|am Samstag
on sunday|am Sonntag
after school|nach der Schule
"""

# frequency adverbs: before the verb in English, after it in German
_FREQUENCY = """
often|oft
sometimes|manchmal
always|immer
never|nie
rarely|selten
usually|meistens
"""

# prepositions that take the dative here: english | german
_PREPOSITIONS = """
in|in
at|bei
with|mit
from|von
near|nahe
behind|hinter
in front of|vor
next to|neben
under|unter
to|zu
"""

_NUMBERS = "two zwei,three drei,four vier,five fünf,six sechs,seven sieben,eight acht,nine neun,ten zehn"

# subordinating conjunctions: english | german (verb-final clause)
_CONJUNCTIONS = """
because|weil
when|wenn
although|obwohl
while|während
"""

_CONTRACTIONS = {
    ("in", "dem"): "im",
    ("bei", "dem"): "beim",
    ("von", "dem"): "vom",
    ("zu", "dem"): "zum",
    ("zu", "der"): "zur",
}


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    de: str
    gender: str  # m, f, n
    de_pl: str

    def de_form(self, plural: bool, case: str) -> str:
        if not plural:
            return self.de
        if case == "d" and not self.de_pl.endswith(("n", "s")):
            return self.de_pl + "n"  # dative plural: den Hunden
        return self.de_pl


@dataclass(frozen=True)
class Verb:
    en_3sg: str
    en_pl: str
    en_pp: str
    de_3sg: str
    de_pl: str
    de_pp: str
    aux: str  # h, s
    case: str  # a, d, - (intransitive)


def _english_plural(word: str) -> str:
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _nouns() -> list[Noun]:
    out = []
    for line in _NOUNS.strip().splitlines():
        en, en_pl, de, gender, de_pl = line.split()
        out.append(Noun(en, _english_plural(en) if en_pl == "-" else en_pl, de, gender, de_pl))
    return out


def _pairs(text: str, sep: str | None = None) -> list[tuple[str, str]]:
    return [tuple(line.split(sep, 1)) for line in text.strip().splitlines()]  # type: ignore[misc]


NOUNS = _nouns()
ADJECTIVES = _pairs(_ADJECTIVES)
VERBS = [Verb(*(w.replace("_", " ") for w in line.split())) for line in _VERBS.strip().splitlines()]
TRANSITIVE = [v for v in VERBS if v.case != "-"]
INTRANSITIVE = [v for v in VERBS if v.case == "-"]
SAY_VERBS = [tuple(line.split()) for line in _SAY_VERBS.strip().splitlines()]
TIME = _pairs(_TIME, "|")
FREQUENCY = _pairs(_FREQUENCY, "|")
PREPOSITIONS = _pairs(_PREPOSITIONS, "|")
NUMBERS = [tuple(p.split()) for p in _NUMBERS.split(",")]
CONJUNCTIONS = _pairs(_CONJUNCTIONS, "|")

# articles by (determiner, case, gender or "pl")
_DEFINITE = {
    "n": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "a": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "d": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
_INDEFINITE = {
    "n": {"m": "ein", "f": "eine", "n": "ein"},
    "a": {"m": "einen", "f": "eine", "n": "ein"},
    "d": {"m": "einem", "f": "einer", "n": "einem"},
}
# adjective endings: weak (after der/die/das), mixed (after ein), strong (no article, plural)
_WEAK = {
    "n": {"m": "e", "f": "e", "n": "e", "pl": "en"},
    "a": {"m": "en", "f": "e", "n": "e", "pl": "en"},
    "d": {"m": "en", "f": "en", "n": "en", "pl": "en"},
}
_MIXED = {
    "n": {"m": "er", "f": "e", "n": "es"},
    "a": {"m": "en", "f": "e", "n": "es"},
    "d": {"m": "en", "f": "en", "n": "en"},
}
_STRONG_PLURAL = {"n": "e", "a": "e", "d": "en"}


def _adjective(stem: str, ending: str) -> str:
    # "müde" + "e" = "müde", "leise" + "en" = "leisen"
    return stem + (ending[1:] if stem.endswith("e") and ending.startswith("e") else ending)


@dataclass(frozen=True)
class Phrase:
    """A noun phrase in both languages, ready for a case in German."""

    en: str
    det: str  # the, a, some, number word, pronoun
    noun: Noun | None
    adjective: tuple[str, str] | None
    plural: bool
    de_number: str = ""  # zwei, drei ...
    pronoun: tuple[str, str, str, str] | None = None  # en, de nom, de acc, de dat

    def de(self, case: str) -> str:
        if self.pronoun:
            return self.pronoun[{"n": 1, "a": 2, "d": 3}[case]]
        assert self.noun is not None
        gender = "pl" if self.plural else self.noun.gender
        words = []
        if self.det == "the":
            words.append(_DEFINITE[case][gender])
            ending = _WEAK[case][gender]
        elif self.det == "a":
            words.append(_INDEFINITE[case][gender])
            ending = _MIXED[case][gender]
        else:  # some / many / a number: strong plural endings
            words.append(self.de_number)
            ending = _STRONG_PLURAL[case]
        if self.adjective:
            words.append(_adjective(self.adjective[1], ending))
        words.append(self.noun.de_form(self.plural, case))
        return " ".join(words)


_PRONOUNS = [
    ("he", "er", "ihn", "ihm"),
    ("she", "sie", "sie", "ihr"),
    ("it", "es", "es", "ihm"),
    ("they", "sie", "sie", "ihnen"),
]


class Grammar:
    """Draws sentence pairs from the toy grammar with one random generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def noun_phrase(self, allow_pronoun: bool = False, definite_only: bool = False) -> Phrase:
        r = self.rng
        if allow_pronoun and r.random() < 0.15:
            p = r.choice(_PRONOUNS)
            return Phrase(p[0], "pronoun", None, None, p[0] == "they", pronoun=p)
        noun = r.choice(NOUNS)
        adjective = r.choice(ADJECTIVES) if r.random() < 0.45 else None
        roll = r.random()
        if definite_only or roll < 0.5:
            det, plural, de_number = "the", r.random() < 0.25, ""
        elif roll < 0.8:
            det, plural, de_number = "a", False, ""
        else:
            plural = True
            det, de_number = r.choice([("some", "einige"), ("many", "viele"), *NUMBERS])
        en_noun = noun.en_pl if plural else noun.en
        en_words = [det]
        if adjective:
            en_words.append(adjective[0])
        en_words.append(en_noun)
        return Phrase(" ".join(en_words), det, noun, adjective, plural, de_number)

    def clause(self, verb_final: bool = False, perfect: bool | None = None) -> tuple[str, str]:
        """A subject-verb(-object)(-place) clause. German main order, or verb-final."""
        r = self.rng
        subject = self.noun_phrase(allow_pronoun=True)
        verb = r.choice(TRANSITIVE if r.random() < 0.75 else INTRANSITIVE)
        if perfect is None:
            perfect = r.random() < 0.2
        frequency = r.choice(FREQUENCY) if not perfect and r.random() < 0.15 else None
        obj = self.noun_phrase(allow_pronoun=True) if verb.case != "-" else None
        place = self.place() if r.random() < 0.3 else None

        en = [subject.en]
        if perfect:
            en += ["have" if subject.plural else "has", verb.en_pp]
        else:
            if frequency:
                en.append(frequency[0])
            en.append(verb.en_pl if subject.plural else verb.en_3sg)
        if obj:
            en.append(obj.en)
        if place:
            en.append(place[0])

        finite_de = verb.de_pl if subject.plural else verb.de_3sg
        if perfect:
            aux = {"h": ("hat", "haben"), "s": ("ist", "sind")}[verb.aux][subject.plural]
            finite_de, tail = aux, [verb.de_pp]
        else:
            tail = []
        middle = []
        if frequency:
            middle.append(frequency[1])
        if obj:
            middle.append(obj.de(verb.case))
        if place:
            middle.append(place[1])
        if verb_final:
            de = [subject.de("n"), *middle, *tail, finite_de]
        else:
            de = [subject.de("n"), finite_de, *middle, *tail]
        return " ".join(en), " ".join(de)

    def place(self) -> tuple[str, str]:
        en_prep, de_prep = self.rng.choice(PREPOSITIONS)
        phrase = self.noun_phrase()
        de = phrase.de("d")
        first, _, rest = de.partition(" ")
        contracted = _CONTRACTIONS.get((de_prep, first))
        de = f"{contracted} {rest}" if contracted else f"{de_prep} {de}"
        return f"{en_prep} {phrase.en}", de

    def sentence(self) -> tuple[str, str]:
        """One sentence pair, from one of the templates."""
        r = self.rng
        kind = r.random()
        if kind < 0.30:  # plain main clause
            en, de = self.clause()
            return _finish(en, de, ".")
        if kind < 0.45:  # fronted time adverbial: verb second
            en_t, de_t = r.choice(TIME)
            en, de = self.clause(perfect=False)
            subject, verb, rest = _split_v2(de)
            return _finish(f"{en_t} {en}", " ".join(filter(None, [de_t, verb, subject, rest])), ".")
        if kind < 0.58:  # reported speech: verb-final "dass" clause
            subject = self.noun_phrase(allow_pronoun=True)
            say = r.choice(SAY_VERBS)
            en_sub, de_sub = self.clause(verb_final=True)
            en = f"{subject.en} {say[1] if subject.plural else say[0]} that {en_sub}"
            de = f"{subject.de('n')} {say[3] if subject.plural else say[2]}, dass {de_sub}"
            return _finish(en, de, ".")
        if kind < 0.70:  # fronted subordinate clause: main clause inverted
            en_c, de_c = r.choice(CONJUNCTIONS)
            en_sub, de_sub = self.clause(verb_final=True)
            en_main, de_main = self.clause(perfect=False)
            subject, verb, rest = _split_v2(de_main)
            de = f"{de_c} {de_sub}, " + " ".join(filter(None, [verb, subject, rest]))
            return _finish(f"{en_c} {en_sub}, {en_main}", de, ".")
        if kind < 0.78:  # trailing subordinate clause
            en_c, de_c = r.choice(CONJUNCTIONS)
            en_main, de_main = self.clause()
            en_sub, de_sub = self.clause(verb_final=True)
            return _finish(f"{en_main} {en_c} {en_sub}", f"{de_main}, {de_c} {de_sub}", ".")
        if kind < 0.86:  # negation with a definite object: nicht at the end
            subject = self.noun_phrase(allow_pronoun=True)
            verb = r.choice(TRANSITIVE)
            obj = self.noun_phrase(definite_only=True)
            do = "do" if subject.plural else "does"
            en = f"{subject.en} {do} not {verb.en_pl} {obj.en}"
            de = f"{subject.de('n')} {verb.de_pl if subject.plural else verb.de_3sg} {obj.de(verb.case)} nicht"
            return _finish(en, de, ".")
        if kind < 0.93:  # yes/no question: verb first
            subject = self.noun_phrase()
            verb = r.choice(TRANSITIVE)
            obj = self.noun_phrase()
            do = "do" if subject.plural else "does"
            en = f"{do} {subject.en} {verb.en_pl} {obj.en}"
            de = f"{verb.de_pl if subject.plural else verb.de_3sg} {subject.de('n')} {obj.de(verb.case)}"
            return _finish(en, de, "?")
        # predicative adjective: no ending
        subject = self.noun_phrase(allow_pronoun=True)
        en_a, de_a = r.choice(ADJECTIVES)
        very = r.random() < 0.3
        en = f"{subject.en} {'are' if subject.plural else 'is'} {'very ' if very else ''}{en_a}"
        de = f"{subject.de('n')} {'sind' if subject.plural else 'ist'} {'sehr ' if very else ''}{de_a}"
        return _finish(en, de, ".")


def _split_v2(de_main: str) -> tuple[str, str, str]:
    """Split a German main clause 'SUBJECT VERB REST' into its parts (subject may be many words)."""
    words = de_main.split()
    # the subject ends at its noun (capitalised) or is a one-word pronoun
    i = 0
    if words[0] in {"er", "sie", "es"}:
        i = 1
    else:
        while not words[i][0].isupper():
            i += 1
        i += 1
    return " ".join(words[:i]), words[i], " ".join(words[i + 1 :])


def _finish(en: str, de: str, mark: str) -> tuple[str, str]:
    return en[0].upper() + en[1:] + mark, de[0].upper() + de[1:] + mark


def generate_pairs(count: int, seed: int = 1, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """`count` distinct sentence pairs (English, German) drawn with `seed`.

    English sentences in `exclude` are skipped (and the new ones are added to it), so that
    splits drawn one after the other never share a sentence.
    """
    rng = random.Random(seed)
    grammar = Grammar(rng)
    seen = exclude if exclude is not None else set()
    out: list[tuple[str, str]] = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 20 * count + 1000:
            raise RuntimeError(f"the grammar cannot give {count} distinct sentences")
        en, de = grammar.sentence()
        if en in seen:
            continue
        seen.add(en)
        out.append((en, de))
    return out


SPLITS = ("train", "valid", "test")


def write_corpus(
    out_dir: str | Path, train: int = 20000, valid: int = 500, test: int = 500, seed: int = 1
) -> dict[str, dict[str, int]]:
    """Write {train,valid,test}.{en,de} under `out_dir`; return lines and bytes per file.

    Test is drawn first, then valid, then train, each skipping what came before: the same
    seed gives the same test set whatever the size of train.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    sizes = {"test": test, "valid": valid, "train": train}
    summary: dict[str, dict[str, int]] = {}
    for offset, split in enumerate(("test", "valid", "train")):
        pairs = generate_pairs(sizes[split], seed=seed * 1000 + offset, exclude=seen)
        for lang, column in (("en", 0), ("de", 1)):
            path = out / f"{split}.{lang}"
            path.write_text("".join(p[column] + "\n" for p in pairs), encoding="utf-8")
            summary[f"{split}.{lang}"] = {"lines": len(pairs), "bytes": path.stat().st_size}
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--valid", type=int, default=500)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    summary = write_corpus(args.out_dir, args.train, args.valid, args.test, args.seed)
    for name, info in summary.items():
        print(f"{name:10} {info['lines']:>8} lines {info['bytes']:>10} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write examples/tinyllm/beyond-stories.txt, the beyond-the-window recall suite.

    make-beyond-suite.py TINYLLM MODEL TOKENIZER > beyond-stories.txt

Each case is one agent's history of TinyStories-like sessions: an introduction
that names a character and gives it a thing ("a little girl named Mia. Mia had
a yellow hat."), unrelated sessions that name no one, then a cue that asks for
the character by its thing and whose next word is the name ("Do you remember
the girl who had a yellow hat? Her name was" -> " Mia"). Half of the cases put
1-3 unrelated sessions before the introduction. How far back the name sits is
given in model windows, so one file serves models of any window.

Introductions and cues come from templates below (names, kinds, things and
wordings varied case by case). The unrelated sessions are sampled from the
model (temperature 0.8, fixed seeds) after a hand-written opening, and kept
only when they name no one (no capitalised word inside a sentence but
Mom/Dad-like words): natural text the models follow, with no other name to
confuse the cue. Running it again with the same binary and model gives the
same file.
"""
import re
import subprocess
import sys

GIRLS = ["Mia", "Sue", "Anna", "Lucy", "Zoe", "Amy", "Kate", "Jill", "Emma", "Molly", "Sara", "Jane",
         "Rosie", "Ella", "Nina", "Ruby", "Tina", "Daisy", "Sally", "Jenny", "Lola", "Bella", "Grace",
         "Susie", "Pam", "Kim", "Mandy", "Ann"]
BOYS = ["Tom", "Ben", "Max", "Sam", "Jack", "Leo", "Bob", "Mark", "Mike", "Billy", "Jake", "Finn",
        "Joe", "Ned", "Dan", "Luke", "Ted", "Peter", "Nick", "Benny", "Ollie", "Jim", "Roy", "Paul"]
# (kind, names) for animals: TinyStories names its pets
ANIMALS = [("dog", ["Spot", "Buddy", "Rex", "Lucky"]), ("cat", ["Kitty", "Mittens", "Fluffy", "Tiger"]),
           ("bunny", ["Hoppy", "Fluff", "Snowy"]), ("bird", ["Tweety", "Chirpy", "Sunny"]),
           ("bear", ["Teddy", "Bruno", "Honey"]), ("frog", ["Hop", "Ribbit"]), ("duck", ["Quacky", "Puddles"])]

# (thing with its colour, what the character does with it)
THINGS = [("a red kite", "fly the kite in the park"), ("a blue ball", "kick the ball in the yard"),
          ("a yellow hat", "wear the hat at the beach"), ("a small boat", "sail the boat on the pond"),
          ("a shiny bike", "ride the bike down the street"), ("a pink doll", "take the doll everywhere"),
          ("a big drum", "play the drum very loud"), ("a green truck", "push the truck in the sand"),
          ("a purple balloon", "hold the balloon tight"), ("an old book", "read the book before bed"),
          ("a silver bell", "ring the bell in the morning"), ("a brown teddy bear", "hug the bear at night"),
          ("an orange wagon", "pull the wagon down the road"), ("a white kitten", "give the kitten milk"),
          ("a box of crayons", "draw pictures with the crayons"), ("a toy train", "make the train go around"),
          ("a jump rope", "jump with the rope in the park"), ("a little garden", "water the garden every day"),
          ("a red umbrella", "splash in the puddles with the umbrella"), ("a magic wand", "wave the wand"),
          ("a big shell", "listen to the shell"), ("a toy robot", "make the robot walk"),
          ("a blue cup", "drink juice from the cup"), ("a music box", "listen to the music box")]
ANIMAL_THINGS = [("a red collar", "wear the collar every day"), ("a soft blanket", "sleep on the blanket"),
                 ("a green ball", "chase the ball in the yard"), ("a little bell", "ring the bell when it ran"),
                 ("a blue bowl", "eat from the bowl"), ("a big bone", "chew the bone"),
                 ("a yellow bow", "wear the bow on its head"), ("a warm nest", "sleep in the nest")]

INTROS = [
    "Once upon a time, there was a {adj}{kind} named {N}. {N} had {thing}. {P} liked to {act}. {N} was very happy.",
    "Once upon a time, in a small town, there lived a {adj}{kind} named {N}. {N} loved {thing_the}. Every day, {p} would {act}.",
    "There was once a {adj}{kind} called {N}. {N} had {thing}, and {p} liked to {act}. It made {N} smile.",
    "Once upon a time, there was a {adj}{kind}. The {kind}'s name was {N}. {N} had {thing}. {P} liked to {act} with {pos} mom.",
]
# cues: the next word is the name, said to the character (TinyStories' own way
# of naming someone known: in the window, stories15M names the character after
# these in 7-8 of 8 tries, where "Her name was" makes it introduce a new one)
CUES = [
    "Mom looked at the {kind} with {thing} and said, \"Good morning,",
    "The {kind} with {thing} came back home. Mom said, \"Welcome home,",
    "Mom found {thing_the} and gave it back. She said, \"Here you go,",
    "A friend saw {thing_the} and said, \"Wow, that is a nice {noun},",
    "The {kind} with {thing} helped Mom. Mom said, \"Thank you,",
    "At night, Mom saw the {kind} with {thing} and said, \"Good night,",
]

OPENINGS = [
    "Once upon a time, there was a big old tree in a field.", "One day, a little red bird sat on a fence.",
    "There was a small boat on a quiet lake.", "The sun was hot and the sky was blue.",
    "A big brown cow lived on a farm.", "The rain fell on the roof all night.",
    "In the forest, there was a family of squirrels.", "The moon was big and bright over the hill.",
    "A small fish swam in a cool river.", "The wind blew hard and the leaves fell.",
    "A little duck went for a walk by the pond.", "The snow was white and cold in the park.",
    "The bees were busy in the garden.", "A big truck drove down the long road.",
    "The sea was big and blue, and the waves went up and down.", "There was a tall castle on a hill.",
    "A little mouse lived in a hole in the wall.", "The farmer had a red barn and many animals.",
    "A happy frog jumped from leaf to leaf.", "The old clock in the house went tick, tock.",
    "A big green dragon lived in a cave.", "The train went fast over the bridge.",
    "A little ant carried a crumb across the kitchen.", "The flowers in the meadow were red and yellow.",
    "A kind old owl lived in a hollow tree.", "The baker made warm bread every morning.",
    "A big elephant walked to the river to drink.", "The stars came out one by one in the dark sky.",
    "A little boat sailed on the big sea.", "There was a shiny star that wanted to come down.",
    "A small turtle walked very slowly to the pond.", "The wind and the sun had a contest.",
    "A little cloud floated over the town.", "A lion lived in the jungle with his friends.",
    "The children went to the zoo on a sunny day.", "There was a magic tree with golden apples.",
    "A busy little spider made a web in the corner.", "The rooster said cock-a-doodle-doo in the morning.",
    "A big bear woke up after the long winter.", "A little puppy found a stick in the yard.",
    "The king had a big garden with a pond.", "A little sheep lost its way on the hill.",
    "The ice cream truck came down the street.", "A tiny seed was planted in the ground.",
    "The fox wanted to eat the grapes on the vine.", "A little car drove up the big hill.",
    "An old man had a small shop in the town.", "A family of ducks lived by the river.",
    "The leaves turned red and orange in the fall.", "A little star was afraid of the dark.",
    "The pig rolled in the mud on a hot day.", "A big ship came to the harbor.",
    "The monkey climbed the tall tree to get a banana.", "A little rabbit dug a hole in the garden.",
    "The school bus was yellow and very big.", "A small bird built a nest in the spring.",
    "A kind giraffe had a very long neck.", "The rain stopped and a rainbow came out.",
    "There was a little house by the sea.", "A playful kitten chased a ball of yarn.",
    "The baby bird wanted to fly for the first time.", "An old boot lay in the grass by the road.",
    "The cookies in the jar smelled very good.", "A big storm came to the little village.",
    "A small plane flew high above the clouds.", "The horse ran fast across the green field.",
    "A little snail wanted to see the world.", "The toys in the box came to life at night.",
    "A friendly whale swam in the deep blue sea.", "The apple tree had many red apples.",
    "A lazy cat slept in the warm sun all day.", "The bell rang and the park was quiet.",
    "A little penguin lived on the ice.", "The bakery had a big cake in the window.",
    "A bunch of balloons flew up into the sky.", "A brave little ant went on a long trip.",
    "The candle was bright in the dark room.", "A little bee could not find its hive.",
]
OPENERS = {"the", "a", "an", "one", "he", "she", "it", "they", "we", "you", "then", "when", "but", "and", "so",
           "there", "this", "that", "his", "her", "their", "every", "once", "as", "after", "at", "in", "on", "from",
           "suddenly", "finally", "soon", "later", "now", "yes", "no", "oh", "wow", "look", "let", "come", "please",
           "thank", "thanks", "hello", "hi", "bye", "goodbye", "what", "why", "how", "where", "who", "can", "do", "don",
           "is", "are", "i", "my", "me", "our", "us", "will", "if", "all", "some", "together", "today", "tomorrow",
           "not", "with", "to", "for", "of", "by", "up", "down", "out", "into", "over", "under", "very", "sure",
           "okay", "good", "great", "little", "big", "everyone", "everybody", "nobody", "someday", "here", "go", "stop",
           "people", "everywhere", "unfortunately", "hey", "well", "your", "wait", "find", "moral", "inside", "would",
           "maybe", "just", "even", "before", "while", "because", "since", "until", "instead", "also", "still", "yet",
           "sometimes", "luckily", "happily", "sadly", "outside", "meanwhile", "nearby", "first", "next", "last",
           "again", "other", "many", "each", "both", "only", "never", "always", "should", "could", "may", "might",
           "must", "did", "does", "was", "were", "have", "has", "had", "be", "give", "take", "make", "see", "run",
           "help", "try", "tell", "say", "ask", "keep", "put", "get", "bring", "remember", "listen", "watch", "these",
           "those", "its", "which", "whenever", "no one", "ok", "ouch", "uh", "hooray", "yay", "hmm", "ah", "aw"}
ALLOWED_CAPS = {"I", "Mom", "Dad", "Mommy", "Daddy", "Mama", "Papa", "Grandma", "Grandpa", "Mr", "Mrs", "Miss",
                "Sir", "God", "OK", "Ok"}


def sample_filler(exe, model, tok, opening, seed):
    out = subprocess.run([exe, "generate", model, "--tokenizer", tok, "--temp", "0.8", "--seed", str(seed),
                          "-n", "150", "--prompt", opening], capture_output=True, text=True, check=True).stdout
    text = opening + out.rstrip("\n")
    text = " ".join(text.split())  # one line
    # keep whole sentences only
    m = list(re.finditer(r'[.!?]"?(?=\s|$)', text))
    if not m:
        return None
    text = text[:m[-1].end()]
    words = re.findall(r"[A-Za-z']+", text)
    # a capitalised word must be a common word (it also occurs in lowercase in
    # the story, or is one of the words that open sentences) or Mom-like: a
    # name ("Annie was excited") is neither
    lower = {w for w in words if w.islower()} | OPENERS
    for w in words:
        base = w.split("'")[0]
        if w[0].isupper() and base not in ALLOWED_CAPS and base.lower() not in lower:
            return None
    for n in GIRLS + BOYS + [x for _, ns in ANIMALS for x in ns]:
        if re.search(r"\b%s\b" % n, text):
            return None
    if len(words) < 40:
        return None
    return text


def main():
    exe, model, tok = sys.argv[1:4]
    fillers = []
    for i, op in enumerate(OPENINGS):
        for seed in range(1000 + 10 * i, 1000 + 10 * i + 10):
            f = sample_filler(exe, model, tok, op, seed)
            if f:
                fillers.append(f)
                break
    people = [(n, "girl", "she", "her") for n in GIRLS] + [(n, "boy", "he", "his") for n in BOYS]
    pets = [(n, kind, "it", "its") for kind, ns in ANIMALS for n in ns]
    cases = []
    # interleave people and pets: every fifth case is an animal
    pi = ai = 0
    for i in range(112):
        if i % 5 == 4:
            n, kind, p, pos = pets[ai % len(pets)]
            ai += 1
            thing, act = ANIMAL_THINGS[i % len(ANIMAL_THINGS)]
        else:
            n, kind, p, pos = people[(pi * 7) % len(people)]
            pi += 1
            thing, act = THINGS[(i * 5) % len(THINGS)]
        act = act.replace("the ", pos + " ", 1) if i % 2 else act
        adj = ["little ", "", "small ", "kind "][i % 4]
        thing_the = "the " + thing.split(" ", 1)[1]
        noun = thing.split(" ")[-1] if " of " not in thing else thing.split(" ", 1)[1]
        fmt = dict(N=n, kind=kind, p=p, P=p.capitalize(), pos=pos, Pos=pos.capitalize(), thing=thing,
                   thing_the=thing_the, act=act, adj=adj, noun=noun)
        intro = INTROS[i % len(INTROS)].format(**fmt)
        cue = CUES[(i // 2) % len(CUES)].format(**fmt)
        cases.append((n, intro, cue))

    print("""# The beyond-the-window recall suite (tinyllm eval --beyond FILE): can an agent
# whose history is several times longer than the model's window still name a
# character it met sessions ago? Written for this (examples/tinyllm/
# make-beyond-suite.py wrote it: templates for the introductions and cues, the
# unrelated sessions sampled from stories15M and kept only when they name no one).
#
# Format (the recall suite's, with two keys added):
#   intro NAME: TEXT   case i's first session names NAME (one word)
#   prompt: TEXT       case i's cue (prompt i goes with intro i): the next word is the name
#   filler: TEXT       an unrelated session
#   before: LIST       cycle: case i has before[i mod n] unrelated sessions BEFORE its intro
#                      (fillers (7*i + 40 + j) mod F), so the intro is not in the history's
#                      first block; reported apart
#   windows: LIST      cycle: after the intro come fillers (7*i + j) mod F until the name is at
#                      least windows[i mod n] model windows (seq_len tokens) before the cue's end:
#                      the same file gives histories of 1-10 windows on any model
# Every session but the first is joined to the history without BOS.""")
    print("before: 0,1,0,2,0,3,0,1,0,2,0,3,0,1,0,2")
    print("windows: 2,1.3,2.5,1.7,3,2.2,4,3.5,5,4.5,6.5,6,8,7.5,9.5,9")
    print()
    for n, intro, cue in cases:
        print("intro %s: %s" % (n, intro))
    print()
    for n, intro, cue in cases:
        print("prompt: %s" % cue)
    print()
    for f in fillers:
        print("filler: %s" % f)


if __name__ == "__main__":
    main()

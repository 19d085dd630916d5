// The real-model mode's data and computation, apart from the DOM: the story
// presets, where the page finds a served model, and a story run through the
// JavaScript API (km.storyOpen, story.session).

// The first preset is `tinyllm demo`'s story (examples/tinyllm/story.c,
// k_sessions): a girl named in the first session, fifteen sessions about
// other things (about four windows of stories15M), then a sentence whose next
// word, in a TinyStories story, is her name. The browser test checks the page
// against that program. The others are short cases of the recall suite
// (examples/tinyllm/recall-stories.txt), within the window.
export const PRESETS = [
  {
    name: "Sue's red kite, four windows back (make demo's story)",
    sessions: [
      'Once upon a time, there was a little girl named Sue. Sue had a red kite. Every day, Sue took her kite to the park with her mom. Sue ran fast, and the kite flew high in the sky. Sue laughed and said, "Look, Mom, my kite is dancing!"',
      'The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song. The bird had a nest with three small eggs. Every day, the bird sat on the eggs to keep them warm. One morning, the eggs began to crack, and three baby birds came out.',
      'A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm barn. The farmer had a dog named Spot. Spot liked to run around the cow and bark. The cow did not mind. She just kept eating her grass and said, "Moo!"',
      'In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for the winter. The baby squirrel was very small, but he wanted to help. He found a big nut and carried it all the way home. His mom was very proud of him.',
      'The rain fell on the roof. Drip, drop, drip, drop. The puddles in the street got bigger and bigger, and the frogs were very happy. They jumped from puddle to puddle and sang their froggy songs. When the rain stopped, a big rainbow came out in the sky.',
      'The moon was big and bright. The stars were shining in the dark sky. An owl sat on a fence and said, "Hoo, hoo." A little mouse heard the owl and ran into his hole. He was scared, but the owl only wanted to say hello.',
      'A small fish swam in the river. The water was cool and clear. The fish saw a shiny stone at the bottom and swam around it. A big turtle came by and said, "That stone is my friend." The fish and the turtle played together all afternoon.',
      'The bees were busy in the garden. They flew from flower to flower. They made sweet honey in their hive. A bear smelled the honey and came to the hive. The bees buzzed very loud, and the bear ran away into the woods.',
      'The sea was big and blue. The waves went up and down. A crab walked sideways on the sand and hid under a rock. A seagull flew over the water and looked for fish. The sun went down, and the sky turned orange and pink.',
      'The snow was white and cold. It covered the houses and the trees. A snowman with a carrot nose stood in a yard. A little rabbit hopped by and looked at the carrot. The rabbit was hungry, but he did not eat the snowman\'s nose.',
      'A big red truck drove down the road. It was full of toys for the children in the town. The driver was a kind man with a big smile. He stopped at every house and gave each child a toy. The children clapped and cheered.',
      'The wind blew through the tall grass. A lion sat on a hill and looked at the land. He was the king of the animals. A small monkey came and sat next to him. Together they watched the sun go down over the trees.',
      'The old clock in the hall went tick, tock, tick, tock. A little mouse lived behind the clock. Every night, when the house was quiet, the mouse came out to look for crumbs. One night he found a big piece of cheese under the table.',
      'A family of ducks lived by the pond. The mother duck had five yellow ducklings. They walked in a line behind her, one, two, three, four, five. They jumped into the water and swam to the other side, where the grass was soft and green.',
      'The train went choo, choo over the hills. It carried people to the big city. A boy looked out of the window and counted the cows in the fields. He saw ten cows, two horses and a big black dog.',
      'The baker made bread every morning. The bread was warm and smelled very good. People came from all over the town to buy it. The baker also made little cakes with pink icing, and the children loved them.',
      'The next morning,',
    ],
  },
  {
    name: "Tom's blue ball",
    sessions: [
      'Once upon a time, there was a boy named Tom. Tom had a big blue ball. He liked to kick the ball in the yard every day.',
      'The rain fell on the roof. Drip, drop, drip, drop. The puddles in the street got bigger and bigger, and the frogs were very happy.',
      'The moon was big and bright. The stars were shining in the dark sky. An owl sat on a fence and said, "Hoo, hoo."',
      'A small fish swam in the river. The water was cool and clear. The fish saw a shiny stone at the bottom and swam around it.',
      'The next day,',
    ],
  },
  {
    name: "Lily's sparkly wand",
    sessions: [
      'Once upon a time, there was a little girl named Lily. Lily had a sparkly wand. She waved her wand and pretended to be a fairy.',
      'The bees were busy in the garden. They flew from flower to flower. They made sweet honey in their hive.',
      'The sea was big and blue. The waves went up and down. A crab walked sideways on the sand and hid under a rock.',
      'The snow was white and cold. It covered the houses and the trees. A snowman with a carrot nose stood in a yard.',
      'A little duck went for a walk by the pond. The duck said, "Quack, quack!" Then it jumped into the water and swam away.',
      'One day,',
    ],
  },
];

/** The model the page is served with: models/models.json, written by
 *  scripts/wasm-build.sh ({ name, model, tokenizer }, file names beside it),
 *  or null when none is served. */
export async function servedModel(base = 'models/') {
  let res;
  try {
    res = await fetch(base + 'models.json', { cache: 'no-cache' });
  } catch {
    return null;
  }
  if (!res.ok) return null;
  const m = await res.json();
  const get = async (file) => {
    const r = await fetch(base + file);
    if (!r.ok) throw new Error(`${base + file}: HTTP ${r.status}`);
    return new Uint8Array(await r.arrayBuffer());
  };
  return { name: m.name || m.model, modelFile: m.model, tokenizerFile: m.tokenizer || null,
    model: await get(m.model), tokenizer: m.tokenizer ? await get(m.tokenizer) : null };
}

/** Run sessions on a story in order; each result gets the milliseconds the
 *  session took (ms). onSession(result, index) is called after each. */
export function runSessions(story, texts, { art = true, artTile = 0 } = {}, onSession = null) {
  const out = [];
  texts.forEach((text, i) => {
    const t0 = performance.now();
    const r = story.session(text, { art, artTile });
    r.ms = performance.now() - t0;
    out.push(r);
    if (onSession) onSession(r, i);
  });
  return out;
}

/** The name the first session gives someone ("a little girl named Sue"), or
 *  null: what the verdict looks for in a later session's continuations. */
export function introducedName(firstText) {
  const m = /\bnamed ([A-Z][A-Za-z]*)/.exec(firstText || '');
  return m ? m[1] : null;
}

const WHO = [['kvmem', "kvmem's memory"], ['rag', 'text RAG'], ['recent', 'the recent window'], ['full', 'the whole history']];

/** Which of a session's four continuations say the name as a word of its
 *  own, and the line `tinyllm demo` prints for it (story.c's verdict):
 *  { named: { kvmem, rag, recent, full }, line }. */
export function recallVerdict(r, name, seqLen) {
  const word = new RegExp(`(^|[^A-Za-z0-9])${name}([^A-Za-z0-9]|$)`);
  const named = Object.fromEntries(WHO.map(([k]) => [k, word.test(r[k].text)]));
  const yes = WHO.filter(([k]) => named[k]).map(([, w]) => w), no = WHO.filter(([k]) => !named[k]).map(([, w]) => w);
  const parts = [];
  if (yes.length) parts.push(`${yes.join(', ')} ${yes.length === 1 ? 'says it' : 'say it'}`);
  if (no.length) parts.push(`${no.join(', ')} ${no.length === 1 ? 'does not' : 'do not'}`);
  return { named, line: `Recall of ${name}, named in session 1, ${(r.history / seqLen).toFixed(1)} windows back: ${parts.join('; ')}.` };
}

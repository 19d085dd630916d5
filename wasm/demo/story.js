// The real-model mode's data and computation, apart from the DOM: the story
// presets, where the page finds a served model, and a story run through the
// JavaScript API (km.storyOpen, story.session).

// The first preset is `tinyllm demo`'s story (examples/tinyllm/story.c,
// k_sessions): the browser test checks the page against that program. The
// others are cases of the recall suite (examples/tinyllm/recall-stories.txt):
// a character named in the first session, other things after, and a last
// session whose next word, in a TinyStories story, is that name.
export const PRESETS = [
  {
    name: "Sue's red kite (make demo's story)",
    sessions: [
      'Once upon a time, there was a little girl named Sue. Sue had a red kite. She liked to fly her kite in the park with her mom.',
      'The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song.',
      'A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm barn.',
      'In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for the winter.',
      'One day,',
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

// A classic script, not a module: it runs where the page's module scripts
// cannot. Opened from disk (file://), a browser refuses ES modules and the
// fetch() of the WebAssembly module, and the page would stay on "loading…"
// forever: say plainly how to serve it instead.
function kvmemServeHint(why) {
  const meta = document.getElementById('meta');
  if (!meta || document.body.dataset.state === 'not-served') return;
  const fromFile = location.protocol === 'file:';
  meta.className = 'meta error';
  meta.replaceChildren();
  const line = (parts) => {
    const p = document.createElement('span');
    p.className = 'hint-line';
    for (const x of parts) p.append(typeof x === 'string' ? document.createTextNode(x) : x);
    meta.append(p);
  };
  const code = (t) => { const c = document.createElement('code'); c.textContent = t; return c; };
  line([fromFile
    ? 'This page was opened from a file (file://). Browsers do not load its WebAssembly module from there, so nothing below can run.'
    : `The page could not start (${why}).`]);
  line(['Serve it over HTTP: in the kvmem checkout run ', code('make demo-web'), ' and open ',
    code('http://127.0.0.1:8765/'), ' (any static server of ', code('build/wasm/www'), ' works, e.g. ',
    code('python3 -m http.server -d build/wasm/www'), ').']);
  document.body.dataset.state = 'not-served';
}
if (location.protocol === 'file:') kvmemServeHint('opened from a file');

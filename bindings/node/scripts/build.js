#!/usr/bin/env node
'use strict';
// Builds libkvmem with CMake for the Node package.
//
//   node scripts/build.js            build from the packed sources (csrc/) or the checkout
//                                    into build/libkvmem.so.0 (the loader's first choice)
//   node scripts/build.js --install  the package's install step: nothing to do when a
//                                    prebuilt library fits this platform, or in a checkout
//                                    (there the library comes from `make build`)
//   node scripts/build.js --prepack  npm pack: the library for this platform into
//                                    prebuilds/<platform>-<arch>/, the C sources into csrc/,
//                                    the repository's LICENSE beside package.json
//   node scripts/build.js --postpack npm pack is done: remove csrc/, prebuilds/ and LICENSE again
//
// KVMEM_BUILD_DIR names the CMake build directory (default build/cmake), so the
// Python package and this one can share one build. Needs cmake and a C compiler.
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');
const { spawnSync } = require('node:child_process');

const pkg = path.resolve(__dirname, '..');
const checkout = path.resolve(pkg, '..', '..');
const csrc = path.join(pkg, 'csrc');
// What a KVMEM_LIBRARY_ONLY configure of the library alone reads
const C_SOURCES = ['CMakeLists.txt', 'cmake', 'core', 'include'];
// The same configuration as scripts/test-bindings.sh's package build: one build serves the Node and Go checks.
const CMAKE_ARGS = ['-DCMAKE_BUILD_TYPE=Release', '-DKVMEM_LIBRARY_ONLY=ON', '-DKVMEM_CUDA=OFF', '-DKVMEM_VULKAN=OFF',
                    '-DKVMEM_BUILD_TESTS=OFF', '-DKVMEM_BUILD_TOOLS=OFF', '-DKVMEM_BUILD_BENCH=OFF'];
const LIB = process.platform === 'darwin' ? 'libkvmem.0.dylib' : 'libkvmem.so.0';
const prebuildDir = path.join(pkg, 'prebuilds', `${process.platform}-${process.arch}`);

const isSources = (d) => fs.existsSync(path.join(d, 'include', 'kvmem.h')) && fs.existsSync(path.join(d, 'core', 'CMakeLists.txt'));

function run(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: 'inherit' });
  if (r.error) throw new Error(`kvmem: cannot run ${cmd}: ${r.error.message} (it needs cmake and a C compiler)`);
  if (r.status !== 0) throw new Error(`kvmem: ${cmd} ${args.join(' ')} failed (exit ${r.status})`);
}

// configure and build from `src`; returns the built library's path
function cmakeBuild(src) {
  const bld = path.resolve(process.env.KVMEM_BUILD_DIR || path.join(pkg, 'build', 'cmake'));
  console.log(`kvmem: building libkvmem from ${src} in ${bld} (CMake, Release)`);
  run('cmake', ['-S', src, '-B', bld, ...CMAKE_ARGS]);
  run('cmake', ['--build', bld, '--target', 'kvmem', 'kvmem_static', '-j', String(os.availableParallelism?.() ?? os.cpus().length)]);
  const lib = path.join(bld, 'core', LIB);
  if (!fs.existsSync(lib)) throw new Error(`kvmem: the CMake build in ${bld} made no ${LIB}`);
  return lib;
}

function copyLib(lib, dir) {
  fs.mkdirSync(dir, { recursive: true });
  const dest = path.join(dir, LIB);
  fs.copyFileSync(fs.realpathSync(lib), dest); // the file, not the SONAME link
  fs.chmodSync(dest, 0o755);
  return dest;
}

function main(mode) {
  if (mode === '--postpack') {
    fs.rmSync(csrc, { recursive: true, force: true });
    fs.rmSync(path.join(pkg, 'prebuilds'), { recursive: true, force: true });
    fs.rmSync(path.join(pkg, 'LICENSE'), { force: true });
    return;
  }
  if (mode === '--prepack') {
    if (!isSources(checkout)) throw new Error('kvmem: npm pack runs in a kvmem checkout (bindings/node)');
    fs.copyFileSync(path.join(checkout, 'LICENSE'), path.join(pkg, 'LICENSE')); // the repository's, in the package
    fs.rmSync(csrc, { recursive: true, force: true });
    for (const rel of C_SOURCES) fs.cpSync(path.join(checkout, rel), path.join(csrc, rel), { recursive: true });
    console.log(`kvmem: prebuilt ${copyLib(cmakeBuild(checkout), prebuildDir)}`);
    return;
  }
  if (mode === '--install') {
    if (process.env.KVMEM_LIBRARY) return console.log('kvmem: KVMEM_LIBRARY is set: nothing to build');
    if (fs.existsSync(path.join(prebuildDir, LIB))) return console.log(`kvmem: using the prebuilt ${path.join(prebuildDir, LIB)}`);
    if (!isSources(csrc)) return; // a checkout: `make build` makes the library
  } else if (mode !== undefined) {
    throw new Error(`kvmem: build.js takes --install, --prepack or --postpack, not ${mode}`);
  }
  const src = isSources(csrc) ? csrc : checkout;
  if (!isSources(src)) throw new Error('kvmem: no C sources to build from (csrc/ or a checkout)');
  console.log(`kvmem: built ${copyLib(cmakeBuild(src), path.join(pkg, 'build'))}`);
}

try {
  main(process.argv[2]);
} catch (e) {
  console.error(e.message);
  process.exit(1);
}

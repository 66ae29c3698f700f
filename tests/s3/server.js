// server.js - the S3-compatible server of the persistence tests: s3rver on 127.0.0.1, with
// AWS Signature Version 4 checked on every request (s3rver itself checks only version 2),
// so that a round trip through it also proves runcell's signing.
//
// usage: node server.js DIR PORT BUCKET ACCESS_KEY SECRET_KEY
// Prints "listening PORT" once it accepts connections.
'use strict';

const crypto = require('crypto');
const S3rver = require('s3rver');

const [dir, port, bucket, accessKey, secretKey] = process.argv.slice(2);

function hmac(key, data) {
  return crypto.createHmac('sha256', key).update(data, 'utf8').digest();
}

function sha256(data) {
  return crypto.createHash('sha256').update(data, 'utf8').digest('hex');
}

// RFC 3986 encoding as SigV4 wants it: unreserved characters stay, the rest is %XX.
function uriEncode(s, keepSlash) {
  return Array.from(Buffer.from(s, 'utf8'))
    .map(b => {
      const c = String.fromCharCode(b);
      if (/[A-Za-z0-9\-._~]/.test(c) || (keepSlash && c === '/')) return c;
      return '%' + b.toString(16).toUpperCase().padStart(2, '0');
    })
    .join('');
}

function canonicalQuery(raw) {
  if (!raw) return '';
  return raw
    .split('&')
    .map(p => p.split('='))
    .map(([k, v = '']) => [uriEncode(decodeURIComponent(k), false), uriEncode(decodeURIComponent(v), false)])
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : 1))
    .map(([k, v]) => k + '=' + v)
    .join('&');
}

function reject(ctx, code, message) {
  ctx.status = 403;
  ctx.type = 'application/xml';
  ctx.body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code +
    '</Code><Message>' + message + '</Message></Error>';
}

async function checkSigV4(ctx, next) {
  const auth = ctx.get('authorization');
  const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/s3\/aws4_request, ?SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})$/.exec(auth);
  if (!m) return reject(ctx, 'AccessDenied', 'requests must be signed with AWS Signature Version 4');
  const [, ak, date, region, signedHeaders, signature] = m;
  if (ak !== accessKey) return reject(ctx, 'InvalidAccessKeyId', 'unknown access key');
  const amzDate = ctx.get('x-amz-date');
  if (!amzDate.startsWith(date)) return reject(ctx, 'SignatureDoesNotMatch', 'date mismatch');
  const [rawPath, rawQuery] = ctx.req.url.split('?', 2);
  const path = rawPath.split('/').map(seg => uriEncode(decodeURIComponent(seg), false)).join('/');
  const headers = signedHeaders.split(';').map(h => h + ':' + (ctx.req.headers[h] || '').trim());
  const canonical = [ctx.method, path, canonicalQuery(rawQuery), headers.join('\n') + '\n',
    signedHeaders, ctx.get('x-amz-content-sha256')].join('\n');
  const scope = date + '/' + region + '/s3/aws4_request';
  const toSign = ['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonical)].join('\n');
  let key = hmac('AWS4' + secretKey, date);
  for (const part of [region, 's3', 'aws4_request']) key = hmac(key, part);
  const expected = hmac(key, toSign).toString('hex');
  if (expected !== signature) {
    return reject(ctx, 'SignatureDoesNotMatch',
      'The request signature we calculated does not match the signature you provided.');
  }
  return next();
}

// S3's conditional writes (PutObject with If-None-Match: * or If-Match: ETAG, which AWS S3
// has honoured since 2024): s3rver 3.7.1 ignores both headers on PUT (it checks
// If-None-Match on GET only), and runcell's fleet leases are built on them, so they are
// checked here. Conditional writes of one key go one at a time (a promise chain per key),
// the check and the write together, as S3 makes them atomic. s3rver also rewrites an object
// in place, so a GET during a PUT can read it half written (S3 never shows that): reads of
// keys written conditionally join the same chain, their body read whole before it moves on.
const keyChains = new Map();
const conditionalKeys = new Set();

function preconditionFailed(ctx) {
  ctx.status = 412;
  ctx.type = 'application/xml';
  ctx.body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>PreconditionFailed</Code>' +
    '<Message>At least one of the pre-conditions you specified did not hold</Message></Error>';
}

async function currentEtag(ctx, bucketName, key) {
  const object = await ctx.app.context.store.getObject(bucketName, key);
  if (!object) return null;
  if (object.content) object.content.destroy();
  return object.metadata.etag;
}

async function readWhole(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return Buffer.concat(chunks);
}

// A conditional PUT whose client went away before its body was whole, or that takes too long
// (they are small records), fails (as S3 fails a request it times out) instead of keeping its
// key's chain: later requests for that key would wait behind it for ever. Only events that do
// not consume the body are listened to: s3rver reads it.
const CONDITIONAL_PUT_MAX_MS = 20000;
function bodyOrGiveUp(ctx) {
  return new Promise((_, reject) => {
    let timer;
    const fail = why => {
      clearTimeout(timer);
      if (ctx.req.complete) return;
      ctx.req.destroy();
      reject(Object.assign(new Error(why), { status: 400, expose: true }));
    };
    timer = setTimeout(() => fail('the request took too long'), CONDITIONAL_PUT_MAX_MS);
    ctx.req.on('end', () => clearTimeout(timer));
    ctx.req.on('close', () => fail('the client went away before its body was whole'));
  });
}

async function conditionalPut(ctx, next) {
  const ifNone = ctx.get('if-none-match');
  const ifMatch = ctx.get('if-match');
  const m = /^\/([^/?]+)\/([^?]+)/.exec(ctx.req.url);
  if (!m) return next();
  const bucketName = decodeURIComponent(m[1]);
  const key = m[2].split('/').map(decodeURIComponent).join('/');
  const id = bucketName + '/' + key;
  const conditional = ctx.method === 'PUT' && (ifNone || ifMatch);
  // A DELETE joins the chain too: a conditional PUT that checked before it must not write
  // the object back after it (S3 orders the two).
  const read = (ctx.method === 'GET' || ctx.method === 'HEAD' || ctx.method === 'DELETE') &&
    conditionalKeys.has(id);
  if (!conditional && !read) return next();
  if (conditional) conditionalKeys.add(id);
  const before = keyChains.get(id) || Promise.resolve();
  let release;
  const mine = new Promise(resolve => (release = resolve));
  const chained = before.then(() => mine);
  keyChains.set(id, chained);
  await before;
  try {
    if (read) {
      await next();
      if (ctx.body && typeof ctx.body.pipe === 'function') ctx.body = await readWhole(ctx.body);
      return;
    }
    const etag = await currentEtag(ctx, bucketName, key);
    if (ifNone === '*' && etag) return preconditionFailed(ctx);
    if (ifMatch && etag !== ifMatch) return preconditionFailed(ctx);
    await Promise.race([next(), bodyOrGiveUp(ctx)]);
  } finally {
    release();
    if (keyChains.get(id) === chained) keyChains.delete(id);
  }
}

const server = new S3rver({
  directory: dir,
  address: '127.0.0.1',
  port: Number(port),
  silent: true,
  configureBuckets: [{ name: bucket }],
});
// First in line, before s3rver's own handling.
// RUNCELL_S3_TEST_PLAIN_PUT=1: s3rver's own PUT, which ignores the conditions (a test that a
// fleet refuses such a store).
if (process.env.RUNCELL_S3_TEST_PLAIN_PUT) server.middleware.unshift(checkSigV4);
else server.middleware.unshift(checkSigV4, conditionalPut);
server.run().then(
  addr => console.log('listening ' + addr.port),
  err => {
    console.error('s3 test server: ' + err.message);
    process.exit(1);
  },
);
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));

// A real OpenID provider for the sign-in tests (tests/oidc_kit.py runs it):
// npm's `oidc-provider`, installed by `.ci/setup --test` under .ci/node, with
// its development login and consent pages, one confidential client and three
// people. Nothing here checks anything: Huddle's side is what is tested.
//
// The conversation over stdio, one JSON line each way:
//   out  {"port": N}                 listening on 127.0.0.1:N (the issuer)
//   in   {"redirectUri", "clientId", "clientSecret"}   Huddle's client, whose
//        /auth/callback is known only once Huddle listens
//   out  {"ready": true}             the provider answers from here on
//
// `POST /__test/tamper` with a body of `aud`, `nonce` or `signature` makes the
// next token answer carry an ID token the provider itself signed for
// another audience or nonce, or the same claims signed by a key it never
// published: what a forged or replayed token looks like to the client.

import { createSign, generateKeyPairSync } from 'node:crypto';
import { createServer } from 'node:http';
import { dirname, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const entry = resolve(root, '.ci/node/node_modules/oidc-provider/lib/index.js');
const { default: Provider } = await import(pathToFileURL(entry).href);

const PEOPLE = {
  dana: { name: 'Dana Scully', email: 'dana@example.com', groups: ['eng-oncall'] },
  olly: { name: 'Olly Watcher', email: 'olly@example.com', groups: ['staff'] },
  nina: { name: 'Nina Nobody', email: 'nina@example.com', groups: [] },
};

function rsaKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return privateKey;
}

const signingKey = rsaKey();
const unpublishedKey = rsaKey();
const kid = 'test-key';

let tamper = null;

function resign(idToken, key, change) {
  const [header, payload] = idToken.split('.');
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
  change(claims);
  const body = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}`;
  const signature = createSign('RSA-SHA256').update(body).sign(key).toString('base64url');
  return `${body}.${signature}`;
}

const TAMPERINGS = {
  // Issued to another client, naming ours as the party it is for (azp):
  // only the aud check refuses it.
  aud: (token) => resign(token, signingKey, (claims) => {
    claims.azp = claims.aud;
    claims.aud = 'another-client';
  }),
  nonce: (token) => resign(token, signingKey, (claims) => { claims.nonce = 'a-replayed-nonce'; }),
  signature: (token) => resign(token, unpublishedKey, () => {}),
};

function tamperingTokenAnswer(res, tampering) {
  const end = res.end.bind(res);
  res.end = (chunk, ...rest) => {
    const answer = JSON.parse(Buffer.from(chunk).toString());
    if (answer.id_token) answer.id_token = tampering(answer.id_token);
    const body = Buffer.from(JSON.stringify(answer));
    res.setHeader('content-length', body.length);
    return end(body, ...rest);
  };
}

const server = createServer();
server.listen(0, '127.0.0.1');
await new Promise((done) => server.once('listening', done));
const { port } = server.address();
process.stdout.write(`${JSON.stringify({ port })}\n`);

const lines = createInterface({ input: process.stdin });
const { redirectUri, clientId, clientSecret } = JSON.parse((await lines[Symbol.asyncIterator]().next()).value);

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    response_types: ['code'],
    grant_types: ['authorization_code'],
  }],
  jwks: { keys: [{ ...signingKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' }] },
  cookies: { keys: ['test-cookie-key-0123456789'] },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name', 'groups'] },
  // The claims go into the ID token, as most providers put them there.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  // PKCE for every client, the confidential one too: a client that sends
  // no code_challenge is refused at the authorization endpoint.
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    const person = PEOPLE[id];
    if (!person) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, ...person, email_verified: true };
      },
    };
  },
});
const callback = provider.callback();

server.on('request', (req, res) => {
  if (req.method === 'POST' && req.url === '/__test/tamper') {
    let body = '';
    req.on('data', (chunk) => { body += chunk; });
    req.on('end', () => {
      tamper = TAMPERINGS[body] ?? null;
      res.writeHead(tamper ? 204 : 400).end();
    });
    return;
  }
  if (req.method === 'POST' && req.url === '/token' && tamper) {
    tamperingTokenAnswer(res, tamper);
    tamper = null;
  }
  callback(req, res);
});
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
lines.on('close', () => process.exit(0));

// Drives a bazaar cluster's Machines API with fly-admin (a third-party Fly client from npm),
// unchanged: create an app and a machine, take a lease and read it back (with its nonce),
// release it, update, stop, start, and delete the app. Prints one JSON line per step
// ({"step", "ok", "detail"}) and exits 0 whatever happened: the Rust test reads the lines.
//
// BAZAAR_API_URL: the API's base URL (http://127.0.0.1:PORT); BAZAAR_TOKEN: an API token.
'use strict';
const fetch = require('cross-fetch');
const Client = require('fly-admin/dist/client').default;

const apiUrl = process.env.BAZAAR_API_URL;
const token = process.env.BAZAAR_TOKEN;
// fly-admin talks to api.machines.dev unless told otherwise: its own option points it here.
const client = new Client(token, { apiUrl });
const app = 'fa-' + Date.now().toString(36);
const config = {
  image: 'process',
  driver: 'process',
  init: { exec: ['sh', '-c', 'while true; do sleep 0.2; done'] },
  guest: { cpu_kind: 'shared', cpus: 1, memory_mb: 256 },
};

async function step(name, run) {
  try {
    const detail = await run();
    console.log(JSON.stringify({ step: name, ok: true, detail: detail ?? null }));
    return detail;
  } catch (e) {
    console.log(JSON.stringify({ step: name, ok: false, detail: String(e && e.message || e) }));
    return undefined;
  }
}

function check(cond, what) {
  if (!cond) throw new Error(what);
}

(async () => {
  await step('create app', async () => {
    await client.App.createApp({ app_name: app, org_slug: 'personal' });
    const list = await client.App.listApps('personal');
    check(list.apps.some((a) => a.name === app), 'the new app is listed');
    return app;
  });
  const machine = await step('create machine', async () => {
    const m = await client.Machine.createMachine({ app_name: app, config, region: 'local' });
    check(typeof m.id === 'string' && m.config.init.exec[0] === 'sh', 'a machine with our config');
    await client.Machine.waitMachine({ app_name: app, machine_id: m.id, state: 'started', timeout: '30s' });
    return m;
  });
  if (!machine) return;
  const ids = { app_name: app, machine_id: machine.id };
  const lease = await step('acquire lease', async () => {
    const l = await client.Machine.acquireLease({ ...ids, ttl: 60, description: 'fly-admin' });
    check(l.data && typeof l.data.nonce === 'string', 'the lease has a nonce');
    return l.data;
  });
  await step('get lease', async () => {
    const l = await client.Machine.getLease(ids);
    check(l.data && l.data.nonce === lease.nonce, 'the current lease with its nonce');
    return l.data;
  });
  await step('release lease', async () => {
    // fly-admin has no call for this; a client releases with the nonce it read.
    const resp = await fetch(`${apiUrl}/v1/apps/${app}/machines/${machine.id}/lease`, {
      method: 'DELETE',
      headers: { Authorization: `Bearer ${token}`, 'fly-machine-lease-nonce': lease.nonce },
    });
    check(resp.ok, `release answered ${resp.status}: ${await resp.text()}`);
    return resp.status;
  });
  await step('update machine', async () => {
    const updated = await client.Machine.updateMachine({
      ...ids,
      config: { ...config, env: { GREETING: 'hello' } },
    });
    check(updated.instance_id !== machine.instance_id, 'a new version');
    check(updated.config.env.GREETING === 'hello', 'the new config');
    await client.Machine.waitMachine({ ...ids, state: 'started', timeout: '30s' });
    return updated.instance_id;
  });
  await step('stop machine', async () => {
    await client.Machine.stopMachine(ids);
    await client.Machine.waitMachine({ ...ids, state: 'stopped', timeout: '30s' });
  });
  await step('start machine', async () => {
    await client.Machine.startMachine(ids);
    await client.Machine.waitMachine({ ...ids, state: 'started', timeout: '30s' });
  });
  await step('delete app', async () => {
    await client.App.deleteApp(app);
    const list = await client.App.listApps('personal');
    check(!list.apps.some((a) => a.name === app), 'the app is gone');
  });
})();

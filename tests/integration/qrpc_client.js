// A session of the stock npm `qrpc` client against hubbub's qpubs listener (protocols/qpubs.md §4), as a
// qpubs user writes it: qrpc.connect(port, host), client.call(name, m, cb). Usage: node qrpc_client.js PORT.
// Prints one JSON line with what the callbacks saw; exits 0, or 1 with the error on stderr.
'use strict'

const qrpc = require('qrpc')

const port = Number(process.argv[2])
const client = qrpc.connect(port, '127.0.0.1')
const out = { listened: [], batches: [] }

function call (name, m) {
  return new Promise((resolve, reject) => {
    client.call(name, m, (err, ret) => (err ? reject(err) : resolve(ret)))
  })
}

function fail (err) {
  process.stderr.write(String((err && err.stack) || err) + '\n')
  process.exit(1)
}

setTimeout(() => fail(new Error('timed out: ' + JSON.stringify(out))), 20000).unref()

async function main () {
  // listen: one callback per event, for as long as the call stays open.
  let gotListen
  const listened = new Promise((resolve) => { gotListen = resolve })
  client.call('listen', { topic: 'npm.*' }, (err, item) => {
    if (err) fail(err)
    out.listened.push(item)
    if (out.listened.length === 2) gotListen()
  })
  // once: the next event is the result.
  const once = call('once', { topic: 'npm.b' })
  out.barrier = await call('ignore', { topic: '__barrier__' })
  out.emitA = await call('emit', { topic: 'npm.a', value: { x: [1, 'two'] } })
  out.emitB = await call('emit', { topic: 'npm.b', value: 'bee' })
  out.once = await once
  await listened
  out.ignored = await call('ignore', { topic: 'npm.*' })

  // An unknown handler: the callback gets an Error with the code.
  try {
    await call('nope', {})
  } catch (err) {
    out.error = { isError: err instanceof Error, message: err.message, code: err.code }
  }

  // A durable subscription: events emitted before it is opened come as a batch; acked; then closed.
  out.created = await call('createSubscription', { topic: 'jobs.*', subId: 'npm-sub' })
  for (let i = 1; i <= 3; i++) await call('emit', { topic: 'jobs.j' + i, value: i })
  await new Promise((resolve, reject) => {
    client.call('openSubscription', { subId: 'npm-sub' }, (err, batch) => {
      if (err) return reject(err)
      out.batches.push(batch)
      call('ack', { subId: 'npm-sub', batch: batch.batch }).then((ack) => {
        out.ack = ack
        resolve()
      }, reject)
    })
  })
  out.closed = await call('closeSubscription', { subId: 'npm-sub' })
  out.deleted = await call('deleteSubscription', { subId: 'npm-sub' })
  process.stdout.write(JSON.stringify(out) + '\n')
  client.close()
  process.exit(0)
}

main().catch(fail)

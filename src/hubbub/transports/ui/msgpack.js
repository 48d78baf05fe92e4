// A small MessagePack decoder (the whole format: nil, booleans, integers to 64 bits, floats, strings,
// binary, arrays, maps, extensions and timestamps), for the payload preview. Bounded: it refuses input that
// claims more bytes than it has, and nests at most 64 deep.

export class MsgpackError extends Error {}

export function decode(bytes) {
  const r = new Reader(bytes);
  const v = r.value(0);
  if (r.pos !== bytes.length) throw new MsgpackError(`${bytes.length - r.pos} bytes after the value`);
  return v;
}

class Reader {
  constructor(bytes) {
    this.b = bytes;
    this.v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  need(n) {
    if (this.pos + n > this.b.length) throw new MsgpackError("truncated");
    const p = this.pos;
    this.pos += n;
    return p;
  }
  u8() { return this.v.getUint8(this.need(1)); }
  u16() { return this.v.getUint16(this.need(2)); }
  u32() { return this.v.getUint32(this.need(4)); }
  big(signed) {
    const p = this.need(8);
    const x = signed ? this.v.getBigInt64(p) : this.v.getBigUint64(p);
    return x >= BigInt(Number.MIN_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x;
  }
  str(n) { const p = this.need(n); return new TextDecoder().decode(this.b.subarray(p, p + n)); }
  bin(n) { const p = this.need(n); return this.b.slice(p, p + n); }
  array(n, depth) { const a = []; for (let i = 0; i < n; i++) a.push(this.value(depth + 1)); return a; }
  map(n, depth) {
    const m = {};
    for (let i = 0; i < n; i++) {
      const k = this.value(depth + 1);
      m[typeof k === "object" ? JSON.stringify(k, replacer) : String(k)] = this.value(depth + 1);
    }
    return m;
  }
  ext(n) {
    const type = this.v.getInt8(this.need(1));
    const data = this.bin(n);
    if (type === -1) return timestamp(data);
    return { ext: type, data };
  }
  value(depth) {
    if (depth > 64) throw new MsgpackError("nested too deep");
    const t = this.u8();
    if (t <= 0x7f) return t;
    if (t >= 0xe0) return t - 0x100;
    if ((t & 0xf0) === 0x80) return this.map(t & 0x0f, depth);
    if ((t & 0xf0) === 0x90) return this.array(t & 0x0f, depth);
    if ((t & 0xe0) === 0xa0) return this.str(t & 0x1f);
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bin(this.u8());
      case 0xc5: return this.bin(this.u16());
      case 0xc6: return this.bin(this.u32());
      case 0xc7: return this.ext(this.u8());
      case 0xc8: return this.ext(this.u16());
      case 0xc9: return this.ext(this.u32());
      case 0xca: return this.v.getFloat32(this.need(4));
      case 0xcb: return this.v.getFloat64(this.need(8));
      case 0xcc: return this.u8();
      case 0xcd: return this.u16();
      case 0xce: return this.u32();
      case 0xcf: return this.big(false);
      case 0xd0: return this.v.getInt8(this.need(1));
      case 0xd1: return this.v.getInt16(this.need(2));
      case 0xd2: return this.v.getInt32(this.need(4));
      case 0xd3: return this.big(true);
      case 0xd4: return this.ext(1);
      case 0xd5: return this.ext(2);
      case 0xd6: return this.ext(4);
      case 0xd7: return this.ext(8);
      case 0xd8: return this.ext(16);
      case 0xd9: return this.str(this.u8());
      case 0xda: return this.str(this.u16());
      case 0xdb: return this.str(this.u32());
      case 0xdc: return this.array(this.u16(), depth);
      case 0xdd: return this.array(this.u32(), depth);
      case 0xde: return this.map(this.u16(), depth);
      case 0xdf: return this.map(this.u32(), depth);
      default: throw new MsgpackError("unused type byte 0x" + t.toString(16));
    }
  }
}

function timestamp(data) {
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let secs, nanos = 0;
  if (data.length === 4) secs = v.getUint32(0);
  else if (data.length === 8) {
    const hi = v.getUint32(0), lo = v.getUint32(4);
    nanos = hi >>> 2;
    secs = (hi & 3) * 2 ** 32 + lo;
  } else if (data.length === 12) {
    nanos = v.getUint32(0);
    secs = Number(v.getBigInt64(4));
  } else return { ext: -1, data };
  return new Date(secs * 1000 + Math.floor(nanos / 1e6)).toISOString();
}

// JSON.stringify's replacer for decoded values: 64-bit integers and binary shown readably.
export function replacer(_key, value) {
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Uint8Array) return "<" + value.length + " bytes: " + hex(value, 32) + ">";
  return value;
}

export function hex(bytes, most) {
  const n = Math.min(bytes.length, most === undefined ? bytes.length : most);
  let out = "";
  for (let i = 0; i < n; i++) out += bytes[i].toString(16).padStart(2, "0") + (i % 16 === 15 ? "\n" : " ");
  return out.trim() + (n < bytes.length ? " …" : "");
}

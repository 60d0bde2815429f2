@0xc3565bb7ccf06e0e;
# walkit's wire protocol: every ZeroMQ message between a client and a bookie is one Envelope.
# A client sends an Envelope of requests; the bookie answers with an Envelope of responses, each
# carrying the txnId of its request. Batches are first-class: one message may carry many
# requests, one AddRequest many entries, one ReadRequest many entry ids.

enum Status {
  ok @0;
  noSuchEntry @1;
  noSuchLedger @2;
  fenced @3;
  unauthorized @4;
  badRequest @5;
  readOnly @6;
  tooManyRequests @7;
  ioError @8;
  invalidTerm @9;
}

# Entries of one ledger, as columns: entry i is (entryIds[i], lacs[i], digests[i], payloads[i]),
# all of ledger `ledgerId`. Each digest covers the ledger id, entry id, LAC and payload. Columns
# of numbers and blobs encode and decode far faster than a list of structs.
struct EntryBatch {
  entryIds @0 :List(Int64);
  lacs @1 :List(Int64);
  digests @2 :List(Data);
  payloads @3 :List(Data);
}

struct AddRequest {
  ledgerId @0 :Int64;
  masterKey @1 :Data;
  recovery @2 :Bool;          # recovery adds pass a fenced ledger
  entries @3 :EntryBatch;
  lafr @4 :Int64 = -1;        # the writer's last add fully replicated (on Qw bookies)
  term @5 :Int64;             # unbounded ledgers: the writer's term (0: none)
  truncate @6 :Bool;          # drop every entry above the highest one of this request
  deferredSync @7 :Bool;      # acknowledge once stored; a ForceRequest makes the entries durable
  truncateFrom @8 :Int64 = -1; # with truncate and no entries: drop every entry from this id on
}

struct ReadRequest {
  ledgerId @0 :Int64;
  entryIds @1 :List(Int64);
  fence @2 :Bool;             # fence the ledger first (recovery reads)
  masterKey @3 :Data;         # required with fence
  previousLac @4 :Int64 = -2; # long poll: answer once the LAC passes it; -2 = no long poll
  timeoutMs @5 :UInt32;
  term @6 :Int64;             # with fence, on unbounded ledgers: move to this term
  maxBytes @7 :UInt64;        # stop before the entry that takes the answer past this (always
                              # answer the first entry held); 0 (older clients): answer all or refuse
}

struct ReadLacRequest {
  ledgerId @0 :Int64;
  fence @1 :Bool;
  masterKey @2 :Data;
  previousLac @3 :Int64 = -2;
  timeoutMs @4 :UInt32;
  term @5 :Int64;
}

struct WriteLacRequest {
  ledgerId @0 :Int64;
  masterKey @1 :Data;
  lac @2 :Int64;
}

struct ForceRequest {
  ledgerId @0 :Int64;
  masterKey @1 :Data;
}

struct Request {
  txnId @0 :UInt64;
  union {
    add @1 :AddRequest;
    read @2 :ReadRequest;
    readLac @3 :ReadLacRequest;
    writeLac @4 :WriteLacRequest;
    force @5 :ForceRequest;
  }
}

struct AddResponse {
  ledgerId @0 :Int64;
  entryIds @1 :List(Int64);
  instance @2 :UInt64;        # the bookie process that answered (random per start)
}

struct ReadResponse {
  ledgerId @0 :Int64;
  entries @1 :EntryBatch;     # the requested entries the bookie holds; absent ids are omitted
  lac @2 :Int64;
  unread @3 :UInt32;          # how many ids at the request's end the bookie did not look at (its
                              # answer reached maxBytes): not absent, ask again; 0 from older bookies
}

struct ReadLacResponse {
  ledgerId @0 :Int64;
  lac @1 :Int64;
  lastEntryId @2 :Int64;
  lafr @3 :Int64 = -1;
}

struct WriteLacResponse {
  ledgerId @0 :Int64;
}

struct ForceResponse {
  ledgerId @0 :Int64;
  instance @1 :UInt64;
}

struct Response {
  txnId @0 :UInt64;
  status @1 :Status;
  message @2 :Text;           # detail for errors
  union {
    error @3 :Void;           # the request could not be decoded
    add @4 :AddResponse;
    read @5 :ReadResponse;
    readLac @6 :ReadLacResponse;
    writeLac @7 :WriteLacResponse;
    force @8 :ForceResponse;
  }
}

struct Envelope {
  union {
    requests @0 :List(Request);
    responses @1 :List(Response);
  }
  disk @2 :UInt64;            # responses: the identity of the bookie's storage (0: unknown)
}

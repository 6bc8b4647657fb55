package xdsload

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
	"weak"

	"google.golang.org/protobuf/types/known/anypb"
)

// A client's clusters are a clusterSet: immutable, and shared by every
// client that holds the same clusters at the same versions. With 1,000
// services and 10,000 clients a map per client would hold ten million
// entries; shared sets hold one per distinct configuration. The fleet also
// remembers which response turned which set into which, so a response
// that many clients receive is decoded and validated once.

// digest identifies content: two 64-bit hashes with independent seeds.
type digest [2]uint64

// clusterSet is the clusters a client holds, sorted by name.
type clusterSet struct {
	id      digest
	names   []name
	eds     []name   // the CLA name of an EDS cluster, zero otherwise
	version []string // per cluster
	index   map[name]int32

	// Worked out once per set, for every client that holds it.
	missing      int      // required clusters not in the set
	firstMissing name     // one of them, for the problem report
	watchAll     []string // every CLA name, sorted: the watch list without Options.WatchEDS
	requiredCLA  map[name]struct{}
}

func (s *clusterSet) len() int {
	if s == nil {
		return 0
	}
	return len(s.names)
}

// lookup returns the index of n in the set, or -1.
func (s *clusterSet) lookup(n name) int {
	if s == nil {
		return -1
	}
	if i, ok := s.index[n]; ok {
		return int(i)
	}
	return -1
}

// nameString is n's string, or "" for the zero name.
func nameString(n name) string {
	if n == (name{}) {
		return ""
	}
	return n.Value()
}

// setEntry is one cluster while a set is built.
type setEntry struct {
	name, eds name
	version   string
}

// sets interns cluster sets and remembers transitions.
type sets struct {
	seeds [2]maphash.Seed

	mu        sync.Mutex
	canonical map[digest]weak.Pointer[clusterSet]
	sweepAt   int
	memo      onceMap[*clusterSet]    // response digest → resulting set
	clas      onceMap[endpointUpdate] // CLA bytes' digest → what they decode to
}

// onceMap runs a computation once per key, for every client that asks for
// it, including those that ask while it runs: a fleet connecting at once
// receives the same response on a thousand streams within milliseconds,
// and a memo filled only after the first decode would let them all decode.
// Past limit keys it forgets them all, and computes again on demand.
type onceMap[V any] struct {
	limit int
	mu    sync.Mutex
	m     map[digest]*onceEntry[V]
}

type onceEntry[V any] struct {
	done chan struct{}
	v    V
	err  error
}

func (o *onceMap[V]) do(key digest, f func() (V, error)) (V, error) {
	o.mu.Lock()
	if e, ok := o.m[key]; ok {
		o.mu.Unlock()
		<-e.done
		return e.v, e.err
	}
	if o.m == nil || len(o.m) >= o.limit {
		o.m = map[digest]*onceEntry[V]{}
	}
	e := &onceEntry[V]{done: make(chan struct{})}
	o.m[key] = e
	o.mu.Unlock()
	defer close(e.done)
	e.v, e.err = f()
	return e.v, e.err
}

// memoLimit bounds the remembered transitions (each holds its set alive),
// claLimit the remembered CLAs.
const (
	memoLimit = 64
	claLimit  = 1 << 14
)

func newSets() *sets {
	return &sets{
		seeds:     [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		canonical: map[digest]weak.Pointer[clusterSet]{},
		sweepAt:   64,
		memo:      onceMap[*clusterSet]{limit: memoLimit},
		clas:      onceMap[endpointUpdate]{limit: claLimit},
	}
}

// cla decodes and validates a CLA's bytes, once for every client that
// receives the same bytes.
func (ss *sets) cla(b []byte) (endpointUpdate, error) {
	h := ss.hasher()
	h.bytes(b)
	return ss.clas.do(h.sum(), func() (endpointUpdate, error) { return decodeCLA(b) })
}

// hasher writes the same bytes into two hashes.
type hasher struct{ h [2]maphash.Hash }

func (ss *sets) hasher() *hasher {
	var h hasher
	h.h[0].SetSeed(ss.seeds[0])
	h.h[1].SetSeed(ss.seeds[1])
	return &h
}

func (h *hasher) bytes(b []byte) {
	var n [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(n[:], uint64(len(b)))
	for i := range h.h {
		h.h[i].Write(n[:l])
		h.h[i].Write(b)
	}
}

func (h *hasher) string(s string) {
	var n [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(n[:], uint64(len(s)))
	for i := range h.h {
		h.h[i].Write(n[:l])
		h.h[i].WriteString(s)
	}
}

func (h *hasher) sum() digest { return digest{h.h[0].Sum64(), h.h[1].Sum64()} }

func (h *hasher) reset() {
	h.h[0].Reset()
	h.h[1].Reset()
}

// responseKey identifies a CDS response applied to prev: its kind (SotW
// replaces, Delta updates), the resources' bytes and versions, the
// removed names. Equal keys give equal sets. The order of the resources
// and of the removed names does not count: it changes nothing in the
// resulting set, and a server may list them in another order for every
// client (go-control-plane's Delta does, from a map), which would cost
// each client a decode of its own.
func (ss *sets) responseKey(prev *clusterSet, replace bool, anys []*anypb.Any, versions func(int) string, removed []string) digest {
	var sum digest // of every resource's digest: the same in any order
	h := ss.hasher()
	add := func() {
		d := h.sum()
		sum[0] += d[0]
		sum[1] += d[1]
		h.reset()
	}
	for i, a := range anys {
		h.string(a.GetTypeUrl())
		h.bytes(a.GetValue())
		h.string(versions(i))
		add()
	}
	for _, r := range removed {
		h.string("removed")
		h.string(r)
		add()
	}
	if replace {
		h.string("sotw")
	} else {
		h.string("delta")
		if prev != nil {
			h.bytes(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, prev.id[0]), prev.id[1]))
		}
	}
	var n [16]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(anys)))
	binary.LittleEndian.PutUint64(n[8:], uint64(len(removed)))
	h.bytes(n[:])
	h.bytes(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, sum[0]), sum[1]))
	return h.sum()
}

// build returns the set of entries (sorted by name, unique), shared with
// any live set of the same content.
func (ss *sets) build(entries []setEntry, required map[name]struct{}) *clusterSet {
	h := ss.hasher()
	for _, e := range entries {
		h.string(e.name.Value())
		h.string(nameString(e.eds))
		h.string(e.version)
	}
	id := h.sum()
	ss.mu.Lock()
	if s := ss.canonical[id].Value(); s != nil {
		ss.mu.Unlock()
		return s
	}
	ss.mu.Unlock()

	s := &clusterSet{
		id:      id,
		names:   make([]name, len(entries)),
		eds:     make([]name, len(entries)),
		version: make([]string, len(entries)),
		index:   make(map[name]int32, len(entries)),
	}
	for i, e := range entries {
		s.names[i], s.eds[i], s.version[i] = e.name, e.eds, e.version
		s.index[e.name] = int32(i)
		if e.eds != (name{}) {
			s.watchAll = append(s.watchAll, e.eds.Value())
		}
	}
	slices.Sort(s.watchAll)
	s.watchAll = slices.Compact(s.watchAll)
	for r := range required {
		i := s.lookup(r)
		if i < 0 {
			if s.missing == 0 {
				s.firstMissing = r
			}
			s.missing++
			continue
		}
		if s.eds[i] != (name{}) {
			if s.requiredCLA == nil {
				s.requiredCLA = map[name]struct{}{}
			}
			s.requiredCLA[s.eds[i]] = struct{}{}
		}
	}

	ss.mu.Lock()
	defer ss.mu.Unlock()
	if other := ss.canonical[id].Value(); other != nil {
		return other // built meanwhile by another client
	}
	ss.canonical[id] = weak.Make(s)
	if len(ss.canonical) >= ss.sweepAt {
		for k, p := range ss.canonical {
			if p.Value() == nil {
				delete(ss.canonical, k)
			}
		}
		ss.sweepAt = max(64, 2*len(ss.canonical))
	}
	return s
}

// entries lists a set's clusters, for building the next one.
func (s *clusterSet) entries() []setEntry {
	out := make([]setEntry, s.len())
	for i := range out {
		out[i] = setEntry{name: s.names[i], eds: s.eds[i], version: s.version[i]}
	}
	return out
}

// sortEntries sorts by name and keeps the last of equal names.
func sortEntries(es []setEntry) []setEntry {
	slices.SortStableFunc(es, func(a, b setEntry) int { return cmp.Compare(a.name.Value(), b.name.Value()) })
	out := es[:0]
	for i, e := range es {
		if i+1 < len(es) && es[i+1].name == e.name {
			continue
		}
		out = append(out, e)
	}
	return out
}

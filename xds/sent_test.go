package xds

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"testing"

	"github.com/estuary-mesh/estuary/host/model"
)

// These tests drive the cache as go-control-plane's server does, with its
// own Subscription and its own edits of it (SetResourceSubscription,
// UpdateResourceSubscriptions), so the edits that made a shared map
// unsafe are the real ones.

// TestWholeSetSharedEditsStayPrivate: two SotW clients of one view are
// sent the same CDS set and record it as one set the cache shares. One
// NACKs it (not sent again), then names a single cluster, which
// go-control-plane applies by deleting names from that stream's map: the
// other's record must not change, and it is not answered again.
func TestWholeSetSharedEditsStayPrivate(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	a, b := newSotwCDS(t, c, "a"), newSotwCDS(t, c, "b")
	ra, rb := a.take(t), b.take(t)
	va, _ := ra.GetVersion()
	vb, _ := rb.GetVersion()
	all := resourceNames(t, ra)
	if va != vb || len(all) != 5 {
		t.Fatalf("versions %q and %q of %d clusters; want one version of 5", va, vb, len(all))
	}
	// Each stream records one entry, not every cluster, and the set it
	// names is one, held by the cache.
	for _, cl := range []*sotwClient{a, b} {
		if m := cl.sub.ReturnedResources(); !maps.Equal(m, map[string]string{baseKey: va}) {
			t.Fatalf("stream record %v, want only the set's version %q", m, va)
		}
	}
	c.mu.Lock()
	set := c.views[proxylessView].sent[tCluster][va].Value()
	c.mu.Unlock()
	if set == nil || len(set.vers) != 5 {
		t.Fatalf("shared set of %q: %v", va, set)
	}

	a.next(t, c, "", true) // NACK
	if len(a.ch) != 0 {
		t.Fatalf("the NACKed set was sent again: %v", resourceNames(t, a.take(t)))
	}
	a.next(t, c, "", false, all[0]) // go-control-plane deletes the other names from a's map
	if got := resourceNames(t, a.take(t)); !slices.Equal(got, all[:1]) {
		t.Fatalf("after naming %s, a got %v", all[0], got)
	}
	if m := b.sub.ReturnedResources(); !maps.Equal(m, map[string]string{baseKey: va}) {
		t.Fatalf("a's subscription change edited b's record: %v", m)
	}
	b.next(t, c, vb, false) // ACK
	if len(b.ch) != 0 {
		t.Fatalf("b was sent its set again: %v", resourceNames(t, b.take(t)))
	}
	c.mu.Lock()
	same := c.views[proxylessView].sent[tCluster][va].Value()
	c.mu.Unlock()
	if same != set || len(same.vers) != 5 {
		t.Fatalf("b's shared set changed: %v", same)
	}

	// A new service: b gets the new set, whole.
	f.service(svcHost(5), 8080)
	c.Push(model.Change{Services: map[string]bool{svcHost(5): true}})
	if got := resourceNames(t, b.take(t)); len(got) != 6 {
		t.Fatalf("b got %d clusters after a service was added, want 6", len(got))
	}
}

// TestDeltaRecordSharedAndUnsubscribe: Delta clients of one view record
// their wildcard CDS set as one shared set, which survives collections
// while their streams can name it. One client unsubscribes the wildcard
// and a cluster, which go-control-plane applies to its map only: the
// other keeps its record, and the first, subscribing the cluster again,
// is sent it again (it no longer holds it). A change is then sent to the
// other as a diff against the shared set.
func TestDeltaRecordSharedAndUnsubscribe(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	var cls []*deltaClient
	var all []string
	for i := range 2 {
		cl, err := newDeltaCDS(t, c, fmt.Sprint("d", i))
		if err != nil {
			t.Fatal(err)
		}
		all, _ = cl.take(t)
		if err := cl.next(t, c, nil, nil); err != nil { // ACK
			t.Fatal(err)
		}
		cls = append(cls, cl)
	}
	a, b := cls[0], cls[1]
	if len(all) != 5 || len(b.sub.ReturnedResources()) != 1 {
		t.Fatalf("%d clusters, b's record %v; want 5 and one entry", len(all), b.sub.ReturnedResources())
	}
	// Nothing else holds the set: the streams' last watches keep it.
	runtime.GC()
	runtime.GC()

	if err := a.next(t, c, nil, []string{"*", all[1]}); err != nil {
		t.Fatal(err)
	}
	if len(a.ch) != 0 {
		t.Fatalf("unsubscribing answered: %v", <-a.ch)
	}
	if _, held := a.sub.ReturnedResources()[all[1]]; held {
		t.Fatalf("a still records %s after unsubscribing it: %v", all[1], a.sub.ReturnedResources())
	}
	if err := a.next(t, c, []string{all[1]}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.take(t); !slices.Equal(got, all[1:2]) {
		t.Fatalf("subscribing %s again sent %v", all[1], got)
	}
	if m := b.sub.ReturnedResources(); len(m) != 1 || m[baseKey] == "" {
		t.Fatalf("a's unsubscription edited b's record: %v", m)
	}

	// svc0 moves from port 8080 to 9090: one cluster removed, one added.
	f.service(svcHost(0), 9090)
	c.Push(model.Change{Services: map[string]bool{svcHost(0): true}})
	got, removed := b.take(t)
	if len(got) != 1 || !slices.Equal(removed, all[:1]) {
		t.Fatalf("b got %v and removed %v; want one new cluster and %s removed", got, removed, all[0])
	}
}

// TestDeltaRecordLivesWithTheStream: a stream's set is held by its last
// watch, which the server keeps through the watch's cancel func, even
// when the watch was answered as it opened: a collection then leaves the
// set in place. Breaking that (the last watch dropped, nothing else
// holding the set) frees it, and the next request ends the stream rather
// than get a diff against a set nobody knows.
func TestDeltaRecordLivesWithTheStream(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	cl, err := newDeltaCDS(t, c, "d")
	if err != nil {
		t.Fatal(err)
	}
	cl.take(t) // answered as it opened: only its cancel func holds it
	runtime.GC()
	runtime.GC()
	if err := cl.next(t, c, nil, nil); err != nil {
		t.Fatalf("ACK after a collection: %v", err)
	}
	if len(cl.ch) != 0 {
		t.Fatal("the ACK was answered")
	}
	cl.cancel()
	cl.cancel = nil
	runtime.GC()
	runtime.GC()
	if err := cl.next(t, c, nil, nil); err != errSentGone {
		t.Fatalf("request after the set was collected: %v, want %v", err, errSentGone)
	}
}

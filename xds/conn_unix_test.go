//go:build unix

package xds

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
)

// countingPool is gRPC's default pool, counting the buffers out.
type countingPool struct {
	mem.BufferPool
	out atomic.Int64
}

func (p *countingPool) Get(n int) *[]byte { p.out.Add(1); return p.BufferPool.Get(n) }
func (p *countingPool) Put(b *[]byte)     { p.out.Add(-1); p.BufferPool.Put(b) }

// TestCountedConnReadsOnReady: a counted connection is read as gRPC reads
// a bare TCP one, holding a buffer only for a read that has data: one
// waiting for its peer holds none, what the peer wrote comes whole, and
// the peer's close is io.EOF with every buffer back in the pool.
func TestCountedConnReadsOnReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := &limitListener{Listener: ln, max: 10, refused: func(net.Addr) {}}
	defer ll.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rr, ok := c.(interface {
		ReadOnReady(int, mem.BufferPool) (*[]byte, int, error)
	})
	if !ok {
		t.Fatal("a counted connection cannot be read on ready")
	}
	pool := &countingPool{BufferPool: mem.DefaultBufferPool()}

	type read struct {
		data string
		err  error
	}
	reads := make(chan read, 1)
	go func() {
		for {
			b, n, err := rr.ReadOnReady(4096, pool)
			if err != nil {
				reads <- read{err: err}
				return
			}
			reads <- read{data: string((*b)[:n])}
			pool.Put(b)
		}
	}()
	// The reader waits for its peer: it must hold no buffer meanwhile.
	// (The check can only pass early, never fail early: poll a while.)
	for range 20 {
		if out := pool.out.Load(); out != 0 {
			t.Fatalf("%d buffers out while the connection is idle", out)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reads:
		if r.err != nil || r.data != "hello" {
			t.Fatalf("read %q, %v; want hello", r.data, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("nothing read within 20s")
	}
	peer.Close()
	select {
	case r := <-reads:
		if !errors.Is(r.err, io.EOF) {
			t.Fatalf("after the peer closed: %q, %v; want EOF", r.data, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no EOF within 20s")
	}
	if out := pool.out.Load(); out != 0 {
		t.Fatalf("%d buffers not given back", out)
	}
}

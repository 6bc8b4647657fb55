package xds

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/estuary-mesh/estuary/host/config"
)

// Limits bound what clients can make the server keep. A zero field takes
// the default from host/config, where plugins.hcl's defaults live.
type Limits struct {
	// MaxViews caps live views: distinct (kind, network, requested
	// networks, cluster) claims of connected nodes. Each view holds a copy
	// of every resource, and every push rebuilds every view.
	MaxViews int
	// MaxConnections caps open client connections.
	MaxConnections int
	// MaxStreamsPerConnection caps concurrent streams on one connection.
	MaxStreamsPerConnection int
	// MaxResourceNames caps the resource names of one request, and of a
	// Delta subscription.
	MaxResourceNames int
	// MaxUnknownTypes caps the distinct type URLs Estuary does not serve
	// that one stream may ask for; they are never answered, so a few cost
	// nothing, but go-control-plane keeps state for each. Zero takes the
	// default, as for the others; a negative value allows none
	// (plugins.hcl's max_unknown_types = 0).
	MaxUnknownTypes int
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	noUnknown := l.MaxUnknownTypes < 0
	def(&l.MaxViews, config.DefaultMaxViews)
	def(&l.MaxConnections, config.DefaultMaxConnections)
	def(&l.MaxStreamsPerConnection, config.DefaultMaxStreamsPerConnection)
	def(&l.MaxResourceNames, config.DefaultMaxResourceNames)
	def(&l.MaxUnknownTypes, config.DefaultMaxUnknownTypes)
	if noUnknown {
		l.MaxUnknownTypes = 0
	}
	return l
}

// Limit names, the label of estuary_xds_limit_refusals_total.
const (
	limitViews         = "views"
	limitConnections   = "connections"
	limitStreams       = "streams_per_connection"
	limitResourceNames = "resource_names"
	limitUnknownTypes  = "unknown_types"
)

// limitListener closes connections beyond max at once, so a client that
// opens too many learns it immediately (its gRPC backs off and retries),
// and reports each.
type limitListener struct {
	net.Listener
	max     int64
	live    atomic.Int64
	refused func(net.Addr)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.live.Add(1) > l.max {
			l.live.Add(-1)
			_ = c.Close()
			l.refused(c.RemoteAddr())
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.live.Add(-1) })
	return c.Conn.Close()
}

// streamLimiter counts the streams of each connection, by the client's
// address (one per TCP connection), and refuses those beyond max with
// ResourceExhausted. gRPC's own MaxConcurrentStreams only makes a
// well-behaved client wait, where an xDS client with more than a handful
// of streams on one connection is broken or hostile: it is told so, and
// counted.
type streamLimiter struct {
	max     int
	mu      sync.Mutex
	live    map[string]int
	refused func(net.Addr)
}

func (l *streamLimiter) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	p, ok := peer.FromContext(ss.Context())
	if !ok {
		return handler(srv, ss)
	}
	key := p.Addr.String()
	l.mu.Lock()
	if l.live[key] >= l.max {
		l.mu.Unlock()
		l.refused(p.Addr)
		return status.Errorf(codes.ResourceExhausted, "xds: this connection already has %d streams (xds max_streams_per_connection)", l.max)
	}
	l.live[key]++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.live[key]--; l.live[key] == 0 {
			delete(l.live, key)
		}
		l.mu.Unlock()
	}()
	return handler(srv, ss)
}

// warnLimiter lets a warning about one client through at most once per
// interval, and says how many it held back since, so a client failing in
// a loop cannot flood the log. Its memory is bounded: past maxKeys
// clients, those quiet for an interval are forgotten, and if all are
// recent, all are.
type warnLimiter struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]*warnState
}

type warnState struct {
	at         time.Time
	suppressed int
}

const warnMaxKeys = 4096

func newWarnLimiter(every time.Duration) *warnLimiter {
	return &warnLimiter{every: every, last: map[string]*warnState{}}
}

// allow reports whether a warning about key may be logged now and, if so,
// how many were held back since the last one.
func (l *warnLimiter) allow(key string) (bool, int) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.last[key]
	if st != nil && now.Sub(st.at) < l.every {
		st.suppressed++
		return false, 0
	}
	if st == nil {
		if len(l.last) >= warnMaxKeys {
			for k, s := range l.last {
				if now.Sub(s.at) >= l.every {
					delete(l.last, k)
				}
			}
			if len(l.last) >= warnMaxKeys {
				clear(l.last)
			}
		}
		st = &warnState{}
		l.last[key] = st
	}
	n := st.suppressed
	st.at, st.suppressed = now, 0
	return true, n
}

// clientKey is how warnings about a client are grouped: its host, as a
// client reconnecting in a loop comes from a new port each time.
func clientKey(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// errLimit is the error a refused request ends its stream with.
func errLimit(limit string, format string, args ...any) error {
	return status.Errorf(codes.ResourceExhausted, "xds: %s (xds max_%s)", fmt.Sprintf(format, args...), limit)
}

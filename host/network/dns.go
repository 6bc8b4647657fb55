package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"
)

// TTL bounds for gateways given by DNS name: an answer is used for its
// TTL, but never re-resolved more often than every MinTTL nor kept longer
// than MaxTTL.
const (
	DefaultMinTTL     = 30 * time.Second
	DefaultMaxTTL     = time.Hour
	DefaultDNSTimeout = 2 * time.Second
)

// resolver keeps the addresses of the DNS names gateways are given by. It
// asks A and AAAA in parallel, re-resolves each name when its answer's TTL
// (clamped) runs out, and keeps the last answer when DNS fails or answers
// with no address at all, so a DNS outage never removes a gateway.
type resolver struct {
	logger   hclog.Logger
	minTTL   time.Duration
	maxTTL   time.Duration
	timeout  time.Duration
	onChange func()

	mu      sync.Mutex
	servers []string
	entries map[string]*dnsEntry
	wake    chan struct{}
}

// dnsEntry is one name's state.
type dnsEntry struct {
	name string
	// v4 and v6 are the last answer of each family; addrs is both, sorted.
	v4, v6   []netip.Addr
	addrs    []netip.Addr
	answered bool
	next     time.Time // when to resolve again
	inflight bool
	// for /debug/networkz
	resolvedAt time.Time
	ttl        time.Duration
	lastErr    string
	queries    int
}

// DNSStatus is one gateway name as /debug/networkz shows it.
type DNSStatus struct {
	Name       string    `json:"name"`
	Addresses  []string  `json:"addresses"`
	Resolved   bool      `json:"resolved"`
	ResolvedAt time.Time `json:"resolved_at,omitzero"`
	TTL        string    `json:"ttl,omitempty"`
	NextAt     time.Time `json:"next_resolution,omitzero"`
	Error      string    `json:"last_error,omitempty"`
	Queries    int       `json:"resolutions"`
}

func newResolver(logger hclog.Logger, minTTL, maxTTL, timeout time.Duration, onChange func()) *resolver {
	return &resolver{
		logger: logger, minTTL: minTTL, maxTTL: maxTTL, timeout: timeout, onChange: onChange,
		entries: map[string]*dnsEntry{}, wake: make(chan struct{}, 1),
	}
}

func (r *resolver) setServers(servers []string) {
	r.mu.Lock()
	r.servers = slices.Clone(servers)
	r.mu.Unlock()
}

// setNames makes names the set to keep resolved: new names resolve at
// once, names no longer wanted are forgotten.
func (r *resolver) setNames(names []string) {
	r.mu.Lock()
	added := false
	for n := range r.entries {
		if !slices.Contains(names, n) {
			delete(r.entries, n)
		}
	}
	for _, n := range names {
		if _, ok := r.entries[n]; !ok {
			r.entries[n] = &dnsEntry{name: n}
			added = true
		}
	}
	r.mu.Unlock()
	if added {
		r.poke()
	}
}

func (r *resolver) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// lookup returns a name's last answer and whether there has been one.
func (r *resolver) lookup(name string) ([]netip.Addr, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	if e == nil {
		return nil, false
	}
	return e.addrs, e.answered
}

func (r *resolver) status() []DNSStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DNSStatus, 0, len(r.entries))
	for _, e := range r.entries {
		st := DNSStatus{Name: e.name, Addresses: []string{}, Resolved: e.answered, ResolvedAt: e.resolvedAt, NextAt: e.next, Error: e.lastErr, Queries: e.queries}
		for _, a := range e.addrs {
			st.Addresses = append(st.Addresses, a.String())
		}
		if e.ttl > 0 {
			st.TTL = e.ttl.String()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b DNSStatus) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// run resolves names as they come due until ctx ends.
func (r *resolver) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*dnsEntry
		next := now.Add(r.maxTTL)
		r.mu.Lock()
		for _, e := range r.entries {
			switch {
			case e.inflight:
			case !e.next.After(now):
				e.inflight = true
				due = append(due, e)
			case e.next.Before(next):
				next = e.next
			}
		}
		r.mu.Unlock()
		for _, e := range due {
			wg.Go(func() { r.resolve(ctx, e) })
		}
		timer.Reset(next.Sub(now))
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// family is one query's outcome.
type family struct {
	addrs []netip.Addr
	ttl   time.Duration // smallest TTL of the answer; 0 if it had no records
	err   error
}

func (r *resolver) resolve(ctx context.Context, e *dnsEntry) {
	r.mu.Lock()
	servers := slices.Clone(r.servers)
	r.mu.Unlock()
	var v4, v6 family
	var wg sync.WaitGroup
	wg.Go(func() { v4 = r.query(ctx, servers, e.name, dns.TypeA) })
	v6 = r.query(ctx, servers, e.name, dns.TypeAAAA)
	wg.Wait()

	r.mu.Lock()
	if r.entries[e.name] != e {
		// Forgotten while resolving.
		r.mu.Unlock()
		return
	}
	now := time.Now()
	e.inflight = false
	e.queries++
	ttl := r.maxTTL
	newV4, newV6 := e.v4, e.v6
	var errs []error
	for _, f := range []struct {
		res *family
		dst *[]netip.Addr
	}{{&v4, &newV4}, {&v6, &newV6}} {
		switch {
		case f.res.err != nil:
			errs = append(errs, f.res.err)
			ttl = min(ttl, r.minTTL) // retry soon; keep that family's last answer
		default:
			*f.dst = f.res.addrs
			if f.res.ttl > 0 {
				ttl = min(ttl, f.res.ttl)
			}
		}
	}
	all := slices.Concat(newV4, newV6)
	slices.SortFunc(all, func(a, b netip.Addr) int { return a.Compare(b) })
	all = slices.Compact(all)
	changed := false
	switch {
	case len(all) == 0 && e.answered:
		// No address at all: keep the last answer rather than drop the gateway.
		ttl = r.minTTL
		e.lastErr = "no address in the answer; keeping the last one"
		if len(errs) > 0 {
			e.lastErr = errors.Join(errs...).Error() + "; keeping the last answer"
		}
	case len(all) == 0:
		ttl = r.minTTL
		e.lastErr = "no address yet"
		if len(errs) > 0 {
			e.lastErr = errors.Join(errs...).Error()
		}
	default:
		changed = !e.answered || !slices.Equal(all, e.addrs)
		e.v4, e.v6, e.addrs, e.answered, e.resolvedAt = newV4, newV6, all, true, now
		e.lastErr = ""
		if len(errs) > 0 {
			e.lastErr = errors.Join(errs...).Error() + "; kept that family's last answer"
		}
	}
	ttl = max(r.minTTL, min(r.maxTTL, ttl))
	e.ttl = ttl
	e.next = now.Add(ttl)
	name, lastErr := e.name, e.lastErr
	r.mu.Unlock()
	r.poke()
	if lastErr != "" {
		r.logger.Warn("gateway DNS name", "name", name, "error", lastErr)
	}
	if changed {
		r.logger.Info("gateway DNS name resolved", "name", name, "addresses", fmt.Sprint(all), "ttl", ttl)
		r.onChange()
	}
}

// query asks the servers in turn for one record type, until one answers.
func (r *resolver) query(ctx context.Context, servers []string, name string, qtype uint16) family {
	if len(servers) == 0 {
		return family{err: fmt.Errorf("no DNS server configured")}
	}
	var lastErr error
	for _, server := range servers {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		m.RecursionDesired = true
		resp, err := r.exchange(ctx, m, server, "udp")
		if err == nil && resp.Truncated {
			resp, err = r.exchange(ctx, m, server, "tcp")
		}
		if err != nil {
			lastErr = fmt.Errorf("%s %s at %s: %w", name, dns.TypeToString[qtype], server, err)
			continue
		}
		if resp.Rcode != dns.RcodeSuccess {
			lastErr = fmt.Errorf("%s %s at %s: %s", name, dns.TypeToString[qtype], server, dns.RcodeToString[resp.Rcode])
			continue
		}
		var f family
		for _, rr := range resp.Answer {
			ttl := time.Duration(rr.Header().Ttl) * time.Second
			if f.ttl == 0 || ttl < f.ttl {
				f.ttl = max(ttl, time.Nanosecond) // a 0 TTL still counts as "answered"
			}
			var ip netip.Addr
			switch rr := rr.(type) {
			case *dns.A:
				ip, _ = netip.AddrFromSlice(rr.A.To4())
			case *dns.AAAA:
				ip, _ = netip.AddrFromSlice(rr.AAAA.To16())
			default:
				continue // CNAMEs count for the TTL only
			}
			if ip.IsValid() {
				f.addrs = append(f.addrs, ip.Unmap())
			}
		}
		return f
	}
	return family{err: lastErr}
}

func (r *resolver) exchange(ctx context.Context, m *dns.Msg, server, network string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	c := &dns.Client{Net: network, Timeout: r.timeout}
	conn, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// miekg/dns turns the context's deadline into the socket's, but does
	// not notice its cancellation: a query to a server that never answers
	// would hold Run's return for the whole timeout. Closing the socket
	// ends the read at once.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	return resp, err
}

// systemDNSServers reads the nameservers of a resolv.conf.
func systemDNSServers(path string) []string {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil || len(cc.Servers) == 0 {
		return []string{"127.0.0.1:53"}
	}
	out := make([]string, 0, len(cc.Servers))
	for _, s := range cc.Servers {
		addr, err := dnsServerAddr(s)
		if err != nil {
			continue
		}
		if cc.Port != "" && cc.Port != "53" {
			if ip, err := netip.ParseAddr(s); err == nil {
				addr = netip.AddrPortFrom(ip, parsePort(cc.Port)).String()
			}
		}
		out = append(out, addr)
	}
	return out
}

func parsePort(s string) uint16 {
	var p uint16
	_, _ = fmt.Sscan(s, &p)
	if p == 0 {
		p = 53
	}
	return p
}

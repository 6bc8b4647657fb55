package consul

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func TestNextIndex(t *testing.T) {
	tests := []struct {
		name      string
		prev, got uint64
		next      uint64
		reset     bool
	}{
		{"first list", 0, 42, 42, false},
		{"forward", 42, 50, 50, false},
		{"unchanged (wait expired)", 42, 42, 42, false},
		{"backwards resets to 0 and relists", 42, 7, 0, true},
		{"zero becomes one", 0, 0, 1, false},
		{"zero after a real index is backwards", 42, 0, 0, true},
		{"zero after the forced one is backwards too", 1, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, reset := nextIndex(tt.prev, tt.got)
			if next != tt.next || reset != tt.reset {
				t.Errorf("nextIndex(%d, %d) = %d, %v; want %d, %v", tt.prev, tt.got, next, reset, tt.next, tt.reset)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	for range 20 { // jitter: try several draws
		var b backoff
		want := retryBase
		for i := range 12 {
			d := b.next()
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", i, d, want/2, want)
			}
			want = min(2*want, retryMax)
		}
		if want != retryMax {
			t.Fatalf("backoff never reached its cap %v", retryMax)
		}
		b.reset()
		if d := b.next(); d > retryBase {
			t.Fatalf("after reset: %v, want at most %v", d, retryBase)
		}
	}
}

func TestBackoffJitters(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		b := backoff{n: 5}
		seen[b.next()] = true
	}
	if len(seen) < 10 {
		t.Errorf("50 draws gave %d distinct delays; watchers that fail together would retry together", len(seen))
	}
}

func TestDescribe(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "http://127.0.0.1:8500/v1/catalog/services?index=42&wait=300000ms",
		Err: fmt.Errorf("dial tcp 127.0.0.1:8500: connect: %w", syscall.ECONNREFUSED)}
	tests := []struct {
		name string
		err  error
		want []string
		not  []string
	}{
		{"403", api.StatusError{Code: 403, Body: "ACL not found"}, []string{"permission denied", "HTTP 403 Forbidden: ACL not found", "token_file"}, nil},
		{"429", api.StatusError{Code: 429, Body: "Your IP is issuing too many concurrent connections, please rate limit your calls\n"},
			[]string{"HTTP 429", "http_max_conns_per_client", "max_watchers"}, nil},
		{"500", api.StatusError{Code: 500, Body: "No cluster leader"}, []string{"Consul failed (HTTP 500 Internal Server Error: No cluster leader)"}, nil},
		{"refused", refused, []string{"cannot reach the agent", "127.0.0.1:8500/v1/catalog/services", "connection refused"}, []string{"index=42"}},
		{"other", errors.New("boom"), []string{"boom"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(tt.err)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("describe = %q, lacks %q", got, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("describe = %q, has %q (it must not change between retries)", got, n)
				}
			}
		})
	}
}

package consul

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestServerErrors: Consul answers every catalog and health query with a
// 5xx (a server without a leader, an overloaded agent), with the proxy in
// front of a real agent (issue 11.7; 429s are TestIndexRulesAndBackoff's).
// The instance turns unhealthy and says which status, keeps every
// endpoint in every response, and once Consul answers again it is healthy
// and holds what changed meanwhile.
// Fails if: a 5xx empties or drops the instance, the health hides the
// status, or the plugin stops retrying.
func TestServerErrors(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	px := startProxy(t, c.Addr)
	p := startStrict(t)
	// Short blocking queries, so the fault reaches every watch soon.
	p.configure(t, agentConfig(px.addr(), `wait_time = "1s"`))
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool {
		return dc1(r) != nil && dc1(r).Synced && len(endpointsOf(r, "web.service.consul")) == 1
	})
	p.setInvariant(func(r *sdktest.Replica) string {
		if got := endpointsOf(r, "web.service.consul"); !slices.Contains(got, "10.0.0.1") {
			return fmt.Sprintf("web's endpoints are %v, want 10.0.0.1 kept", got)
		}
		return ""
	})
	for i, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			px.setFault(func(r *http.Request) fault {
				if strings.HasPrefix(r.URL.Path, "/v1/catalog/") || strings.HasPrefix(r.URL.Path, "/v1/health/") {
					return fault{status: status}
				}
				return fault{}
			})
			want := fmt.Sprintf("Consul failed (HTTP %d %s", status, http.StatusText(status))
			p.waitFor(t, wait, "unhealthy, naming the status", func(r *sdktest.Replica) bool {
				h, msg, _ := healthOf(r)
				return !h && strings.Contains(msg, want)
			})
			addr := fmt.Sprintf("10.0.0.%d", i+2)
			register(t, client, api.AgentServiceRegistration{ID: fmt.Sprintf("web-%d", i+2), Name: "web", Port: 8080, Address: addr}, api.HealthPassing)
			px.setFault(nil)
			p.waitFor(t, wait, "healthy, with the endpoint registered meanwhile", func(r *sdktest.Replica) bool {
				h, _, _ := healthOf(r)
				return h && slices.Contains(endpointsOf(r, "web.service.consul"), addr)
			})
		})
	}
}

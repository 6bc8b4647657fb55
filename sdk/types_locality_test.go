package sdk

import "testing"

// TestLocalityFailover: a service's choice overrides the mesh's either
// way, unset follows it, and a changed choice is a changed service (so
// the state helper sends it).
func TestLocalityFailover(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		set        *bool
		mesh, want bool
	}{{nil, false, false}, {nil, true, true}, {&on, false, true}, {&off, true, false}} {
		if got := LocalityFailoverOf(tc.set).Enabled(tc.mesh); got != tc.want {
			t.Errorf("service %v, mesh %v: enabled %v, want %v", LocalityFailoverOf(tc.set), tc.mesh, got, tc.want)
		}
	}
	a, b := Service{Hostname: "a"}, Service{Hostname: "a", LocalityFailover: LocalityFailoverOn}
	if a.Equal(&b) {
		t.Error("services differing in locality_failover are equal")
	}
}

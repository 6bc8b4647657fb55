package sdk

import (
	"strings"
	"testing"
)

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

// TestParseLocalityFailover: the annotation takes "true" and "false"
// only; anything else (a typo, another spelling of a bool) is an error
// naming the value, and follows the mesh.
func TestParseLocalityFailover(t *testing.T) {
	for in, want := range map[string]LocalityFailover{"true": LocalityFailoverOn, "false": LocalityFailoverOff} {
		if got, err := ParseLocalityFailover(in); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yes", "True", "1", "on"} {
		got, err := ParseLocalityFailover(in)
		if err == nil || got != LocalityFailoverMesh || !strings.Contains(err.Error(), `"`+in+`"`) {
			t.Errorf("%q: %v, %v; want an error naming it and the mesh's setting", in, got, err)
		}
	}
}

package model

import "testing"

func TestClusterNames(t *testing.T) {
	name := ClusterName(8080, "v1", "echo.default.svc.cluster.local")
	if name != "outbound|8080|v1|echo.default.svc.cluster.local" {
		t.Fatalf("ClusterName = %q", name)
	}
	port, subset, host, ok := ParseClusterName(name)
	if !ok || port != 8080 || subset != "v1" || host != "echo.default.svc.cluster.local" {
		t.Errorf("ParseClusterName = %d %q %q %v", port, subset, host, ok)
	}
	for _, bad := range []string{"inbound|80||h", "outbound|x||h", "outbound|80|h"} {
		if _, _, _, ok := ParseClusterName(bad); ok {
			t.Errorf("ParseClusterName(%q) accepted", bad)
		}
	}
}

func TestSNIClusterNames(t *testing.T) {
	for _, tc := range []struct {
		port         uint32
		subset, host string
		name         string
	}{
		{8080, "", "echo.default.svc.cluster.local", "outbound_.8080_._.echo.default.svc.cluster.local"},
		{15010, "v1", "a_.b", "outbound_.15010_.v1_.a_.b"},
	} {
		if got := SNIClusterName(tc.port, tc.subset, tc.host); got != tc.name {
			t.Errorf("SNIClusterName = %s, want %s", got, tc.name)
		}
		p, s, h, ok := ParseSNIClusterName(tc.name)
		if !ok || p != tc.port || s != tc.subset || h != tc.host {
			t.Errorf("ParseSNIClusterName(%s) = %d %q %q %v", tc.name, p, s, h, ok)
		}
	}
	for _, bad := range []string{"outbound|8080||h", "outbound_.x_._.h", "outbound_.80_._.", "inbound_.80_._.h"} {
		if _, _, _, ok := ParseSNIClusterName(bad); ok {
			t.Errorf("ParseSNIClusterName(%q) accepted", bad)
		}
	}
}

func TestViewSees(t *testing.T) {
	all := View{}
	if !all.Sees("n1") || !all.Sees("") {
		t.Errorf("a view without REQUESTED_NETWORK_VIEW must see every network")
	}
	v := View{Networks: "n1,n3"}
	for net, want := range map[string]bool{"n1": true, "n3": true, "n2": false, "": true} {
		if v.Sees(net) != want {
			t.Errorf("Sees(%q) = %v, want %v", net, !want, want)
		}
	}
}

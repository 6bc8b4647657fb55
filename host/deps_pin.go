//go:build depspin

// Package host: this file only keeps go.mod's requirements while the packages
// that use them are being written. It is never built.
package host

import (
	_ "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	_ "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/hashicorp/consul/api"
	_ "github.com/hashicorp/hcl/v2/hcldec"
	_ "github.com/miekg/dns"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.uber.org/goleak"
	_ "google.golang.org/grpc/xds"
	_ "istio.io/api/networking/v1alpha3"
	_ "k8s.io/client-go/dynamic"
	_ "k8s.io/client-go/kubernetes"
	_ "sigs.k8s.io/yaml"
)

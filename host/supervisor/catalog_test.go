package supervisor

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/plugins/static"
)

// TestCatalogValidate checks that a bundled plugin's config block is decoded
// against the schema the plugin declares, and that every problem comes back
// at once, in file order, with its position.
func TestCatalogValidate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "estuary-plugin-missing")
	tests := []struct {
		name string
		src  string
		want []string
	}{{
		name: "valid",
		src: `plugin "static" {
  config {
    cluster = "c1"
    service "echo.example.com" {
      port "http" {
        number   = 80
        protocol = "HTTP"
      }
      endpoint {
        address = "10.0.0.1"
        ports   = { http = 8080 }
        labels  = { version = "v1" }
      }
    }
    gateway {
      network = "n1"
      address = "1.1.1.1"
      port    = 15443
    }
  }
}

plugin "east" {
  bundled = "static"
}
`,
	}, {
		name: "unknown attribute",
		src: `plugin "static" {
  config {
    cluster = "c1"
    colour  = "blue"
  }
}
`,
		want: []string{`plugins.hcl:4:5: error: Unsupported argument: An argument named "colour" is not expected here`},
	}, {
		name: "unknown block",
		src: `plugin "static" {
  config {
    services "echo.example.com" {}
  }
}
`,
		want: []string{`plugins.hcl:3:5: error: Unsupported block type: Blocks of type "services" are not expected here. Did you mean "service"?`},
	}, {
		name: "wrong type",
		src: `plugin "static" {
  config {
    service "echo.example.com" {
      port "http" {
        number = "eighty"
      }
    }
  }
}
`,
		want: []string{`plugins.hcl:5:18: error: Incorrect attribute value type: Inappropriate value for attribute "number": a number is required`},
	}, {
		name: "missing required number in a port block",
		src: `plugin "static" {
  config {
    service "echo.example.com" {
      port "grpc" {
        protocol = "GRPC"
      }
    }
  }
}
`,
		want: []string{`plugins.hcl:4:19: error: Missing required argument: The argument "number" is required, but no definition was found`},
	}, {
		name: "missing block label",
		src: `plugin "static" {
  config {
    service {
    }
  }
}
`,
		want: []string{`plugins.hcl:3:13: error: Missing hostname for service: All service blocks must have 1 labels (hostname)`},
	}, {
		name: "every error in two plugins at once, in file order",
		src: `plugin "static" {
  config {
    cluster = "c1"
    colour  = "blue"
    service "echo.example.com" {
      port "http" {
        number = "eighty"
      }
      port "grpc" {
        protocol = "GRPC"
      }
      endpoint {
        address = "10.0.0.1"
        labels  = "v1"
      }
    }
    gateway {
      network = "n1"
      address = "1.1.1.1"
    }
  }
}

plugin "west" {
  bundled = "static"
  config {
    cluster = ["west"]
  }
}

plugin "ext" {
  path   = "` + missing + `"
  sha256 = "` + strings.Repeat("0", 64) + `"
}
`,
		want: []string{
			`plugins.hcl:4:5: error: Unsupported argument: An argument named "colour" is not expected here`,
			`plugins.hcl:7:18: error: Incorrect attribute value type: Inappropriate value for attribute "number": a number is required`,
			`plugins.hcl:9:19: error: Missing required argument: The argument "number" is required, but no definition was found`,
			`plugins.hcl:14:19: error: Incorrect attribute value type: Inappropriate value for attribute "labels": map of string required, but have string`,
			`plugins.hcl:17:13: error: Missing required argument: The argument "port" is required, but no definition was found`,
			`plugins.hcl:27:15: error: Incorrect attribute value type: Inappropriate value for attribute "cluster": string required, but have tuple`,
			fmt.Sprintf(`plugins.hcl:32:12: error: Plugin binary not found: Plugin "ext": open %s: no such file or directory`, missing),
		},
	}}
	catalog := Catalog{"static": static.Factory}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, diags := config.Parse("plugins.hcl", []byte(tt.src), catalog.Names())
			if diags.HasErrors() {
				t.Fatalf("parse: %s", config.Format(diags))
			}
			// Decoding order must not depend on map iteration: check a few
			// times.
			for range 5 {
				got := config.Format(catalog.Validate(f))
				want := ""
				if len(tt.want) > 0 {
					want = strings.Join(tt.want, "\n") + "\n"
				}
				if got != want {
					t.Fatalf("diagnostics:\n got:\n%s\nwant:\n%s", got, want)
				}
			}
			if tt.want == nil {
				for _, p := range f.Plugins {
					if p.ConfigJSON == nil {
						t.Errorf("plugin %q: ConfigJSON not set after a clean validate", p.Label)
					}
				}
			}
		})
	}
}

// TestCatalogValidateConfigJSON checks the JSON a valid block decodes to:
// what the plugin's Configure will receive.
func TestCatalogValidateConfigJSON(t *testing.T) {
	f, diags := config.Parse("plugins.hcl", []byte(`plugin "static" {
  config {
    cluster = "c1"
    service "echo.example.com" {
      port "http" { number = 80 }
    }
  }
}
`), []string{"static"})
	if diags.HasErrors() {
		t.Fatal(config.Format(diags))
	}
	if d := (Catalog{"static": static.Factory}).Validate(f); d.HasErrors() {
		t.Fatal(config.Format(d))
	}
	js := string(f.Plugins[0].ConfigJSON)
	for _, want := range []string{`"cluster":"c1"`, `"network":null`, `"hostname":"echo.example.com"`, `"name":"http"`, `"number":80`, `"gateway":[]`} {
		if !strings.Contains(js, want) {
			t.Errorf("config JSON lacks %s:\n%s", want, js)
		}
	}
}

func TestCatalogDescribeUnknown(t *testing.T) {
	f, diags := config.Parse("plugins.hcl", []byte("\nplugin \"consul\" {}\n"), []string{"consul", "static"})
	if diags.HasErrors() {
		t.Fatal(config.Format(diags))
	}
	got := config.Format(Catalog{"static": static.Factory}.Validate(f))
	want := `plugins.hcl:2:1: error: Cannot describe plugin: plugin "consul": no bundled plugin named "consul"` + "\n"
	if got != want {
		t.Errorf("got  %swant %s", got, want)
	}
	if names := (Catalog{"static": nil, "consul": nil, "a": nil}).Names(); !slices.Equal(names, []string{"a", "consul", "static"}) {
		t.Errorf("Names() = %v, want sorted", names)
	}
}

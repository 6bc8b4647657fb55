package sdk

import (
	"slices"
	"testing"
)

func TestSchemaRedact(t *testing.T) {
	s := &Schema{
		Attributes: []Attribute{{Name: "token", Sensitive: true}, {Name: "address"}, {Name: "n", Type: "number"}},
		Blocks: []Block{{TypeName: "auth", Labels: []string{"name"}, Body: Schema{Attributes: []Attribute{
			{Name: "passwords", Type: "list(string)", Sensitive: true},
		}}}},
	}
	js := []byte(`{"token":"t0k3n","address":"https://u:p@h:1","n":1.50,"auth":[{"name":"a","passwords":["p1","p2"]}],"unset":null}`)
	got := string(s.Redact(js))
	want := `{"address":"https://redacted@h:1","auth":[{"name":"a","passwords":"(sensitive)"}],"n":1.50,"token":"(sensitive)","unset":null}`
	if got != want {
		t.Errorf("Redact =\n%s\nwant\n%s", got, want)
	}
	vals := s.SensitiveValues(js)
	slices.Sort(vals)
	if !slices.Equal(vals, []string{"p1", "p2", "t0k3n"}) {
		t.Errorf("SensitiveValues = %q", vals)
	}
}

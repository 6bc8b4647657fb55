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

// TestSensitiveValuesNestedOnly: a schema whose only sensitive attribute
// is in a nested block still yields it (SensitiveValues skips blocks of
// schemas without any), and one without any yields nothing.
func TestSensitiveValuesNestedOnly(t *testing.T) {
	nested := &Schema{Blocks: []Block{{TypeName: "outer", Body: Schema{Blocks: []Block{{TypeName: "auth", Body: Schema{
		Attributes: []Attribute{{Name: "password", Sensitive: true}},
	}}}}}}}
	js := []byte(`{"outer":[{"auth":[{"password":"s3cret"}]}]}`)
	if got := nested.SensitiveValues(js); !slices.Equal(got, []string{"s3cret"}) {
		t.Errorf("SensitiveValues = %q, want [s3cret]", got)
	}
	plain := &Schema{Attributes: []Attribute{{Name: "address"}}}
	if got := plain.SensitiveValues([]byte(`{"address":"s3cret"}`)); got != nil {
		t.Errorf("SensitiveValues without sensitive attributes = %q", got)
	}
}

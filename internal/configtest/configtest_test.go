package configtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var errConfig = errors.New("demo: invalid config")

type demoConfig struct {
	Name string
	Size int
}

// newDemo stands for a component's constructor; its faults are switched on
// by the test to show that FieldErrors catches each.
func newDemo(c demoConfig, fault string) error {
	switch {
	case c.Name == "" && fault == "accept":
		return nil
	case c.Name == "" && fault == "unwrapped":
		return errors.New("demo: Name is required")
	case c.Name == "" && fault == "unnamed":
		return fmt.Errorf("%w: a field is wrong", errConfig)
	case c.Name == "" && fault == "noprefix":
		return fmt.Errorf("%w: Name is required", errors.New("invalid"))
	case c.Name == "":
		return fmt.Errorf("%w: Name is required", errConfig)
	case c.Size < 0:
		return fmt.Errorf("%w: Size must not be negative", errConfig)
	case fault == "refusevalid":
		return fmt.Errorf("%w: refused", errConfig)
	}
	return nil
}

// recorder is a TB that keeps the failures.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

var cases = []Case[demoConfig]{
	{"Name", func(c *demoConfig) { c.Name = "" }},
	{"Size", func(c *demoConfig) { c.Size = -1 }},
}

func TestFieldErrorsPassesAGoodComponent(t *testing.T) {
	FieldErrors(t, "demo: ", errConfig, demoConfig{Name: "x"}, func(c demoConfig) error { return newDemo(c, "") }, cases)
}

// Each planted fault fails the check, with a message saying which.
func TestFieldErrorsCatchesEachFault(t *testing.T) {
	if errors.Is(errors.New("x"), errConfig) {
		t.Fatal("sentinel matches anything")
	}
	for fault, want := range map[string]string{
		"accept":      "accepted",
		"unwrapped":   "does not wrap",
		"unnamed":     "does not read",
		"noprefix":    "does not wrap", // not ErrConfig either
		"refusevalid": "the valid Config is refused",
	} {
		r := &recorder{}
		FieldErrors(r, "demo: ", errConfig, demoConfig{Name: "x"}, func(c demoConfig) error { return newDemo(c, fault) }, cases)
		if len(r.errs) != 1 || !strings.Contains(r.errs[0], want) {
			t.Errorf("fault %s: failures %q, want one saying %q", fault, r.errs, want)
		}
	}
	r := &recorder{}
	sentinel := errors.New("invalid")
	FieldErrors(r, "demo: ", sentinel, demoConfig{Name: "x"}, func(c demoConfig) error {
		if c.Name == "" {
			return fmt.Errorf("%w: Name is required", sentinel)
		}
		return nil
	}, cases[:1])
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "does not read") {
		t.Errorf("missing prefix: failures %q", r.errs)
	}
	r = &recorder{}
	FieldErrors(r, "demo: ", errConfig, demoConfig{Name: "x"}, func(c demoConfig) error { return newDemo(c, "") }, nil)
	if len(r.errs) != 1 {
		t.Errorf("no cases: failures %q, want one", r.errs)
	}
}

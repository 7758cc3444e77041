// Package configtest checks, for any component, that every invalid Config
// field is refused with the package's ErrConfig and an error that names the
// field, so an operator knows what to fix without reading the source. Each
// package lists its own cases; the checks are the same everywhere, so they
// live here once. Only tests import it.
package configtest

import (
	"errors"
	"strings"
)

// TB is the part of testing.TB that FieldErrors uses (a small interface, so
// that its own test can show it fails).
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Case is one invalid setting: Field is the name the error must carry, and
// Break makes a valid Config invalid in that field only. It is an alias of
// a plain struct, so that a table row stays {"DB", func(c *Config) {...}}
// (vet asks for keyed fields only in literals of another package's named
// struct types).
type Case[C any] = struct {
	Field string
	Break func(*C)
}

// FieldErrors checks that check accepts valid, and that for every case it
// refuses a copy of valid broken by the case with an error that wraps
// sentinel and reads "<prefix>invalid config: <Field> ..." (prefix is the
// package's "name: "), the one wording of a config error in every package.
// check builds the component from a Config and returns the error. It
// reports every failing case, not only the first.
func FieldErrors[C any](t TB, prefix string, sentinel error, valid C, check func(C) error, cases []Case[C]) {
	t.Helper()
	if err := check(valid); err != nil {
		t.Errorf("configtest: the valid Config is refused: %v", err)
		return
	}
	if len(cases) == 0 {
		t.Errorf("configtest: no cases")
	}
	for i, tc := range cases {
		c := valid
		tc.Break(&c)
		err := check(c)
		switch {
		case err == nil:
			t.Errorf("configtest: case %d (%s): accepted, want an error naming %s", i, tc.Field, tc.Field)
		case !errors.Is(err, sentinel):
			t.Errorf("configtest: case %d (%s): %v does not wrap %v", i, tc.Field, err, sentinel)
		case !strings.HasPrefix(err.Error(), prefix+"invalid config: "+tc.Field):
			t.Errorf("configtest: case %d (%s): %q does not read %q", i, tc.Field, err, prefix+"invalid config: "+tc.Field+" ...")
		}
	}
}

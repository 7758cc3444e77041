package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The DSN's form picks the driver; every MySQL form stays MySQL.
func TestDSNSelectsDriver(t *testing.T) {
	t.Parallel()
	for dsn, pg := range map[string]bool{
		"postgres://u:p@127.0.0.1:5432/d":            true,
		"PostgreSQL://u:p@127.0.0.1/d":               true,
		"host=127.0.0.1 dbname=d":                    true,
		" dbname = d host=127.0.0.1":                 true,
		"u:p@tcp(127.0.0.1:3306)/d":                  false,
		"u:p@tcp(127.0.0.1:3306)/d?x=y":              false,
		"u@unix(/tmp/m.sock)/d":                      false,
		"/d":                                         false,
		"u:p=q@tcp(127.0.0.1:3306)/d":                false,
		"user_name:pw@/d?parseTime=true&loc=UTC":     false,
		"postgresx://u:p@127.0.0.1/d":                false,
		"tcp(127.0.0.1:3306)/d":                      false,
		"host=127.0.0.1 password='a b' dbname=d x=y": true,
	} {
		require.Equal(t, pg, isPostgresDSN(dsn), dsn)
	}
}

// Every password a PostgreSQL DSN holds is found, in each form an error
// could quote it, whether or not the DSN parses.
func TestPGDSNSecrets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn  string
		want []string
	}{
		{"postgres://u:pw1@h/d", []string{"pw1"}},
		{"postgres://u:p%40w%2F1@h/d", []string{"p%40w%2F1", "p@w/1"}},
		{"postgres://u:p@w@h/d", []string{"p@w"}},
		{"postgres://u:p/w@h/d", []string{"p/w"}},
		{"postgres://u@h/d?password=q%26w&sslpassword=s1", []string{"q%26w", "q&w", "s1"}},
		{"postgres://u:pw2@h:x/d", []string{"pw2"}},
		{"host=h password=pw3 dbname=d", []string{"pw3"}},
		{`host=h password='p w\'4' dbname=d`, []string{"p w'4"}},
		{"host=h password = 'unterminated", []string{"unterminated"}},
		{"host=h sslpassword=s2 password=p5", []string{"s2", "p5"}},
	} {
		got := pgDSNSecrets(tc.dsn)
		for _, w := range tc.want {
			require.Contains(t, got, w, tc.dsn)
		}
		sec := collectSecrets(nil, func(k string) string { return map[string]string{"RMQTX_DSN": tc.dsn}[k] })
		for _, w := range tc.want {
			require.Equal(t, "error: ***.", sec.scrub("error: "+w+"."), tc.dsn)
		}
	}
}

// The masked form keeps everything but the passwords.
func TestMaskPGDSN(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://u:pw@127.0.0.1:5433/d?sslmode=disable":       "postgres://u:***@127.0.0.1:5433/d?sslmode=disable",
		"postgres://u@127.0.0.1/d?password=x&application_name=a": "postgres://u@127.0.0.1/d?password=***&application_name=a",
		"postgresql://u%20v:p%40@[::1]:5433/d":                   "postgresql://u%20v:***@[::1]:5433/d",
		`host=h user=u password='a b\'c' dbname='my db'`:         `host=h user=u password=*** dbname='my db'`,
		"host=h sslpassword=s dbname=d":                          "host=h sslpassword=*** dbname=d",
	} {
		require.Equal(t, want, maskPGDSN(dsn), dsn)
	}
}

package consumer

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/observe"
)

// Config carries every field of ProcessorConfig at its own level, and
// Processing and setProcessing copy each of them: a field added to
// ProcessorConfig and forgotten in Config (or in the copies) fails here.
func TestConfigProcessingCarriesEveryField(t *testing.T) {
	t.Parallel()
	pt, ct := reflect.TypeFor[ProcessorConfig](), reflect.TypeFor[Config]()
	var p ProcessorConfig
	pv := reflect.ValueOf(&p).Elem()
	for i := range pt.NumField() {
		f := pt.Field(i)
		cf, ok := ct.FieldByName(f.Name)
		require.True(t, ok, "Config has no field %s", f.Name)
		require.Len(t, cf.Index, 1, "Config.%s is not Config's own field", f.Name)
		require.Equal(t, f.Type, cf.Type, "Config.%s", f.Name)
		require.Equal(t, f.Anonymous, cf.Anonymous, "Config.%s embedded or not as in ProcessorConfig", f.Name)
		pv.Field(i).Set(nonZero(t, f.Type))
	}

	var c Config
	c.setProcessing(p)
	got := c.Processing()
	gv := reflect.ValueOf(got)
	for i := range pt.NumField() {
		name := pt.Field(i).Name
		require.False(t, gv.Field(i).IsZero(), "Processing() loses %s", name)
		require.True(t, same(pv.Field(i), gv.Field(i)), "Processing() changes %s", name)
		require.True(t, same(pv.Field(i), reflect.ValueOf(c).FieldByName(name)), "setProcessing() changes %s", name)
	}
}

// nonZero returns a value of type typ that is not its zero value.
func nonZero(t *testing.T, typ reflect.Type) reflect.Value {
	t.Helper()
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int64:
		v.SetInt(7)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Map:
		v.Set(reflect.MakeMap(typ))
	case reflect.Pointer:
		v.Set(reflect.New(typ.Elem()))
	case reflect.Func:
		v.Set(reflect.MakeFunc(typ, func([]reflect.Value) []reflect.Value {
			out := make([]reflect.Value, typ.NumOut())
			for i := range out {
				out[i] = reflect.Zero(typ.Out(i))
			}
			return out
		}))
	case reflect.Struct:
		require.Positive(t, typ.NumField(), "%s", typ)
		v.Field(0).Set(nonZero(t, typ.Field(0).Type))
	case reflect.Interface:
		require.Equal(t, reflect.TypeFor[logrus.FieldLogger](), typ, "no non-zero value for %s", typ)
		v.Set(reflect.ValueOf(logrus.New()))
	default:
		t.Fatalf("no non-zero value for %s (%s): extend nonZero", typ, typ.Kind())
	}
	return v
}

// same reports whether a and b hold the same value; functions and maps are
// the same when they are the same object.
func same(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Func, reflect.Map:
		return a.Pointer() == b.Pointer()
	case reflect.Struct:
		for i := range a.NumField() {
			if !same(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// A Config written in the earlier form, with the processing fields inside
// ProcessorConfig, still builds the same consumer; a Config that sets both
// forms is refused rather than silently merged.
func TestDeprecatedProcessorConfigStillWorks(t *testing.T) {
	t.Parallel()
	db := sqlx.NewDb(nil, "mysql")
	l := logrus.New()
	routes := map[string]Route{"T": {Handler: func(_ context.Context, _ *sqlx.Tx, _ Event) error { return nil }}}
	old := Config{
		ProcessorConfig: ProcessorConfig{Group: "g", DB: db, Routes: routes, MaxRetries: 3,
			ProcessTimeout: time.Minute, Observe: observe.Observe{Logger: l}},
		NameServers: []string{"127.0.0.1:9876"}, Topic: "t",
	}
	flat := Config{Group: "g", DB: db, Routes: routes, MaxRetries: 3, ProcessTimeout: time.Minute,
		Observe: observe.Observe{Logger: l}, NameServers: []string{"127.0.0.1:9876"}, Topic: "t"}

	co, err := New(old)
	require.NoError(t, err)
	cf, err := New(flat)
	require.NoError(t, err)
	got, want := co.Config(), cf.Config()
	require.True(t, got.ProcessorConfig.isZero(), "the deprecated field is emptied once copied")
	require.Equal(t, "g", got.Group)
	require.Same(t, l, got.Logger)
	require.Equal(t, 3, got.MaxRetries)
	require.Equal(t, want.MaxReconsumeTimes, got.MaxReconsumeTimes, "defaults derived from the copied fields")
	got.InstanceName, want.InstanceName = "", ""
	require.True(t, same(reflect.ValueOf(want.Processing()), reflect.ValueOf(got.Processing())),
		"both forms give the Processor the same config")
	require.Equal(t, want.Processing().Observe, co.Processor().cfg.Observe)

	both := flat
	both.ProcessorConfig = ProcessorConfig{Group: "other"}
	_, err = New(both)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "ProcessorConfig (deprecated)")
}

/* A stand-in GStreamer plugin for tests: an element named nvarguscamerasrc (a GstBaseSrc that makes nothing),
 * so that a csi:// camera's capture path can be checked on a machine without JetPack. Built with cc and no
 * GStreamer headers: the types' sizes are asked of GObject at run time. */
#include <stddef.h>
typedef unsigned long GType;
typedef struct { GType type; const char *type_name; unsigned class_size; unsigned instance_size; } GTypeQuery;
GType gst_base_src_get_type(void);
void g_type_query(GType type, GTypeQuery *query);
GType g_type_register_static_simple(GType parent, const char *name, unsigned class_size, void (*class_init)(void *, void *),
                                    unsigned instance_size, void (*instance_init)(void *, void *), int flags);
void gst_element_class_set_static_metadata(void *klass, const char *longname, const char *classification,
                                           const char *description, const char *author);
int gst_element_register(void *plugin, const char *name, unsigned rank, GType type);
void *gst_caps_new_any(void);
void *gst_pad_template_new(const char *name, int direction, int presence, void *caps);
void gst_element_class_add_pad_template(void *klass, void *templ);

static void class_init(void *klass, void *data) {
    gst_element_class_set_static_metadata(klass, "edged test stand-in", "Source/Video", "makes nothing", "edged tests");
    gst_element_class_add_pad_template(klass, gst_pad_template_new("src", 1 /* GST_PAD_SRC */, 0 /* ALWAYS */,
                                                                   gst_caps_new_any()));
}

static int plugin_init(void *plugin) {
    GTypeQuery q;
    GType parent = gst_base_src_get_type();
    g_type_query(parent, &q);
    GType t = g_type_register_static_simple(parent, "EdgedStandinArgusSrc", q.class_size, class_init, q.instance_size,
                                            NULL, 0);
    return gst_element_register(plugin, "nvarguscamerasrc", 0, t);
}

typedef struct {
    int major_version, minor_version;
    const char *name, *description;
    int (*plugin_init)(void *plugin);
    const char *version, *license, *source, *package, *origin, *release_datetime;
    void *_gst_reserved[4];
} GstPluginDesc;

const GstPluginDesc *gst_plugin_edgedargus_get_desc(void);
static const GstPluginDesc desc = {1, 0, "edgedargus", "edged test stand-in for nvarguscamerasrc", plugin_init,
                                   "1.99.0", "LGPL", "edged", "edged tests", "https://example.invalid", NULL, {0}};
const GstPluginDesc *gst_plugin_edgedargus_get_desc(void) { return &desc; }
const GstPluginDesc gst_plugin_desc = {1, 0, "edgedargus", "edged test stand-in for nvarguscamerasrc", plugin_init,
                                       "1.99.0", "LGPL", "edged", "edged tests", "https://example.invalid", NULL, {0}};

/* figure.c - the images a cell displayed, saved as files named after the cell that made
 * them: one naming and one writer for run --out, the REPL and the agent. */
#include "session/session.h"

#include <errno.h>
#include <string.h>

/* The raster images a bundle may hold, in the order they are preferred, with the extension a
 * saved one takes. Every surface asks exec_bundle_image: one list. */
static const char *const image_types[][2] = {
    {"image/png", "png"}, {"image/jpeg", "jpg"}, {"image/gif", "gif"}, {"image/webp", "webp"}};

static char *figure_name(long cell, size_t n, const char *mime)
{
    const char *ext = "png";
    for (size_t i = 0; mime && i < ARRAY_SIZE(image_types); i++)
        if (!strcmp(mime, image_types[i][0]))
            ext = image_types[i][1];
    return xasprintf("figure-%ld-%zu.%s", cell, n, ext);
}

const char *exec_bundle_image(json_t *bundle, const char **ret_mime)
{
    for (size_t i = 0; i < ARRAY_SIZE(image_types); i++) {
        const char *b64 = json_string_value(json_object_get(bundle, image_types[i][0]));
        if (b64) {
            if (ret_mime)
                *ret_mime = image_types[i][0];
            return b64;
        }
    }
    return NULL;
}

int exec_figure_save(struct workspace *ws, const char *out_dir, long cell, size_t n,
                     const char *mime, const char *b64, char **ret_name)
{
    size_t len;
    _cleanup_free_ unsigned char *data = base64_decode(b64, strlen(b64), &len);
    _cleanup_free_ char *name = figure_name(cell, n, mime);
    int r;
    if (!data)
        return err_set(EINVAL, "cannot save %s: the image is not base64", name);
    if (out_dir) {
        _cleanup_free_ char *path = xasprintf("%s/%s", out_dir, name);
        if ((r = mkdir_p(out_dir, 0755)) < 0 ||
            (r = write_file(path, (const char *)data, len, 0644)) < 0)
            return err_set(-r, "cannot save %s: %s", path, strerror(-r));
    } else if ((r = workspace_write(ws, name, data, len)) < 0) {
        return r;
    }
    *ret_name = TAKE_PTR(name);
    return 0;
}

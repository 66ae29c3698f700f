// files.js - a session's workspace: list, upload (a button, or files dropped on the panel),
// download, delete and a preview of images and text (CSV as text). File names come from the
// sandbox and are shown as text only; downloads are blobs of a type no browser renders
// (application/octet-stream), so that a file named like a page is saved, never opened here.
import {api, download, filePath, upload} from './api.js';
import {append, bytes, clear, h, saveBlob, toast} from './dom.js';

const IMAGE = {png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif',
               webp: 'image/webp'};
const TEXT = /\.(csv|tsv|txt|json|md|py|js|sh|log|ya?ml|xml|html?|ini|toml|cfg)$/i;
const PREVIEW_CAP = 64 << 10;

function ext(path) { const m = /\.([^./]+)$/.exec(path); return m ? m[1].toLowerCase() : ''; }

export function filePanel(sid) {
  const list = h('div', {class: 'file-list', id: 'file-list'});
  const preview = h('div', {class: 'preview', id: 'file-preview'});
  const picker = h('input', {type: 'file', multiple: true, id: 'file-input', hidden: true,
                             'aria-label': 'Files to upload'});
  let previewUrl = null;

  async function refresh() {
    try {
      const r = await api('GET', '/v1/sessions/' + encodeURIComponent(sid) + '/files');
      clear(list);
      if (!r.files.length) list.append(h('p', {class: 'muted'}, 'No files yet.'));
      for (const f of r.files) list.append(row(f));
      if (r.truncated) list.append(h('p', {class: 'warn'}, 'The listing was cut short.'));
    } catch (e) {
      clear(list).append(h('p', {class: 'error'}, 'Cannot list the files: ' + e.message));
    }
  }

  function row(f) {
    return h('div', {class: 'file', 'data-path': f.path},
      h('span', {class: 'file-name', title: f.path}, f.path),
      h('span', {class: 'muted'}, f.type === 'symlink' ? 'link' : bytes(f.size)),
      h('span', {class: 'file-actions'},
        f.type === 'file' ? h('button', {type: 'button', class: 'preview-file',
                                         'aria-label': 'View ' + f.path,
                                         onclick: () => show(f)}, 'View') : null,
        f.type === 'file' ? h('button', {type: 'button', class: 'download-file',
                                         'aria-label': 'Download ' + f.path,
                                         onclick: () => save(f)}, 'Download') : null,
        h('button', {type: 'button', class: 'delete-file', 'aria-label': 'Delete ' + f.path,
                     onclick: () => remove(f)}, 'Delete')));
  }

  async function show(f) {
    try {
      const blob = await download(sid, f.path);
      if (previewUrl) URL.revokeObjectURL(previewUrl);
      previewUrl = null;
      clear(preview).append(h('div', {class: 'preview-name'}, f.path));
      const type = IMAGE[ext(f.path)];
      if (type) {
        // Re-typed as the image type the name says: the blob is only ever an <img>.
        previewUrl = URL.createObjectURL(new Blob([blob], {type}));
        preview.append(h('img', {src: previewUrl, alt: f.path, class: 'preview-image'}));
      } else if (TEXT.test(f.path) || blob.size < 4096) {
        const text = await blob.slice(0, PREVIEW_CAP).text();
        append(preview, [h('pre', {class: 'preview-text', tabindex: '0'}, text),
          blob.size > PREVIEW_CAP ? h('p', {class: 'muted'}, 'the first ' + bytes(PREVIEW_CAP) +
                                                             ' of ' + bytes(blob.size)) : null]);
      } else {
        preview.append(h('p', {class: 'muted'}, 'No preview for this kind of file; download it.'));
      }
    } catch (e) {
      toast('Cannot read ' + f.path + ': ' + e.message, 'error');
    }
  }

  async function save(f) {
    try {
      saveBlob(f.path.split('/').pop(), await download(sid, f.path));
    } catch (e) {
      toast('Cannot download ' + f.path + ': ' + e.message, 'error');
    }
  }

  async function remove(f) {
    try {
      await api('DELETE', filePath(sid, f.path));
      toast('Deleted ' + f.path);
    } catch (e) {
      toast('Cannot delete ' + f.path + ': ' + e.message, 'error');
    }
    refresh();
  }

  async function uploadAll(files) {
    for (const file of files) {
      try {
        const r = await upload(sid, file.name, file);
        toast('Uploaded ' + r.path + ' (' + bytes(r.size) + ')');
      } catch (e) {
        toast('Cannot upload ' + file.name + ': ' + e.message, 'error');
      }
    }
    refresh();
  }

  picker.addEventListener('change', () => { uploadAll([...picker.files]); picker.value = ''; });
  const el = h('div', {class: 'card files', id: 'files-panel'},
    h('h2', {}, 'Files ', h('button', {type: 'button', id: 'upload-button',
                                      onclick: () => picker.click()}, 'Upload'),
      h('button', {type: 'button', id: 'refresh-files', onclick: () => refresh()}, 'Refresh')),
    picker,
    h('p', {class: 'muted drop-hint'}, 'Drop files here to upload them into the workspace.'),
    list, preview);
  el.addEventListener('dragover', (ev) => { ev.preventDefault(); el.classList.add('dropping'); });
  el.addEventListener('dragleave', () => el.classList.remove('dropping'));
  el.addEventListener('drop', (ev) => {
    ev.preventDefault();
    el.classList.remove('dropping');
    if (ev.dataTransfer && ev.dataTransfer.files.length) uploadAll([...ev.dataTransfer.files]);
  });
  refresh();
  return {el, refresh};
}

# The collection's HTML docs (make docs, scripts/docs.sh): the plugin and role pages antsibull-docs writes, and the
# guide (the pages of docs/, Markdown through MyST). Offline: no intersphinx, so a reference into the Ansible
# docsite stays unresolved (scripts/docs.sh allows exactly those, by label).
project = "orbite.qualification"
copyright = "OrbiTE qualification contributors"
extensions = ["sphinx_antsibull_ext", "myst_parser"]
pygments_style = "ansible"
# The guide's code blocks without a language are shell and directory trees, not YAML.
highlight_language = "none"
html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
html_copy_source = False
html_use_modindex = False
html_use_index = False
default_role = "any"
nitpicky = True
myst_heading_anchors = 3
